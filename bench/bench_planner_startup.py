"""The planner with its start-up configured or measured, on every load of
``bench_simulate.py``: GPU-hours and SLO-violating minutes side by side.

Configured: ``startupSeconds`` at the simulated cold starts' maximum (300 s), as the
docs/planner.md told users to take it. Measured: no ``startupSeconds``; the planner takes the 90th
percentile of the Ready replicas' creation to Ready (the simulator's pod watch), 180 s
until three replicas have shown theirs. Only the planner runs (no reference search).

Usage: .venv/bin/python bench/bench_planner_startup.py [--jobs N]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_planner_alone import run_planner
from bench.bench_simulate import Case, cases
from gpuscale.common.errors import Unavailable


def run(job: tuple[Case, bool]) -> tuple[str, bool, float, int, float]:
    """(load, measured?, GPU-hours, SLO minutes, the start-up planned with at the end)."""
    case, measured = job
    result, policy, duration = run_planner(case, measure_startup=measured)
    plan = policy.plan(duration)
    return (case.name, measured, result.gpu_hours, result.slo_violation_minutes,
            float("nan") if isinstance(plan, Unavailable) else plan.startup)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    began = time.perf_counter()
    jobs = [(case, measured) for case in cases(False) for measured in (False, True)]
    with ProcessPoolExecutor(args.jobs) as pool:
        got = list(pool.map(run, jobs))
    print(f"# {platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}"
          f", {args.jobs} jobs, {time.perf_counter() - began:.0f} s")
    head = (f"{'load':<24}{'configured GPU-h':>17}{'SLO min':>8}{'measured GPU-h':>16}"
            f"{'SLO min':>8}{'start-up s':>11}")
    print(head)
    print("-" * len(head))
    totals = [0.0, 0, 0.0, 0]
    for fixed, measured in zip(got[::2], got[1::2], strict=True):
        print(f"{fixed[0]:<24}{fixed[2]:>17.2f}{fixed[3]:>8d}{measured[2]:>16.2f}"
              f"{measured[3]:>8d}{measured[4]:>11.0f}")
        totals = [totals[0] + fixed[2], totals[1] + fixed[3], totals[2] + measured[2],
                  totals[3] + measured[3]]
    print(f"{'all loads':<24}{totals[0]:>17.2f}{totals[1]:>8d}{totals[2]:>16.2f}"
          f"{totals[3]:>8d}")


if __name__ == "__main__":
    main()
