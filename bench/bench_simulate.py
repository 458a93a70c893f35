"""gpuscale simulate speed and the vllm-inference profile's sensitivity, for BENCHMARKS.md.

Part 1 - speed. The issue's target: a one-hour trace with ~20k requests and six policies
in under a minute. The shipped Azure conversation trace at its own rate is 19,366 requests
over one hour; ``compare`` runs the six policies (the oracle's search included). Reports
the wall time of the whole and of the oracle's search, best of ``--repeat``.

Part 2 - sensitivity (``--sweep``). The vllm-inference profile's requests target (with its
KV-cache target) against the oracle on the trace at 2x, 4x and 8x and two synthetic
patterns: GPU-hours relative to the oracle and SLO-violation minutes, per target.

Usage: .venv/bin/python bench/bench_simulate.py [--repeat 3] [--sweep]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

from gpuscale.control.hpa import Metric
from gpuscale.control.serving import ServingFleet, ServingParams
from gpuscale.control.simulate import (
    Signal,
    compare,
    oracle_plan,
    profile_signal,
    run_policy,
    scale_trace,
    synthetic,
)
from gpuscale.telemetry.load import Request, read_trace

TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / \
    "azure-llm-inference-2023-conv.csv"


def speed(repeat: int) -> None:
    requests = scale_trace(read_trace(TRACE), 1.0, 1.0, None)
    duration = requests[-1].arrival_s + 300.0
    totals, oracles = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        results = compare(requests, duration)
        totals.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        oracle_plan(requests, duration, ServingParams())
        oracles.append(time.perf_counter() - t0)
    print(f"{len(requests)} requests over {duration / 60:.0f} simulated minutes, "
          f"{len(results)} policies, 1 s steps")
    print(f"  compare, all policies (best of {repeat}):  {min(totals):6.2f} s")
    print(f"  of which the oracle's search:         {min(oracles):6.2f} s")


def _profile(target: float) -> Signal:
    requests = profile_signal({"signal": "vllm-requests", "targetValue": str(target)})
    kv = profile_signal({"signal": "vllm-kv-cache", "targetValue": "80"})

    def both(fleet: ServingFleet, now: float) -> list[Metric]:
        return requests(fleet, now) + kv(fleet, now)
    return both


def sweep(targets: tuple[float, ...]) -> None:
    trace = read_trace(TRACE)
    cases: list[tuple[str, list[Request]]] = [
        (f"trace x{r:g}", scale_trace(trace, r, 1.0, None)) for r in (2.0, 4.0, 8.0)]
    cases += [("diurnal 30 req/s", synthetic("diurnal", 3600.0, 30.0)),
              ("bursts 30 req/s", synthetic("bursts", 3600.0, 30.0))]
    params = ServingParams()
    print(f"{'load':<18}{'oracle GPU-h':>13}  " + "  ".join(
        f"{'target ' + format(t, 'g'):>16}" for t in targets))
    for name, requests in cases:
        duration = requests[-1].arrival_s + 300.0
        plan, oracle = oracle_plan(requests, duration, params)
        start = max(plan[:int(params.cold_start_s) + 1])
        cells = []
        for t in targets:
            r = run_policy("v", requests, duration, params, _profile(t), start=start)
            cells.append(f"{r.gpu_hours / oracle.gpu_hours - 1:+5.0%} {r.slo_violation_minutes:3d}"
                         f"/{r.minutes:<3d}")
        print(f"{name:<18}{oracle.gpu_hours:>13.2f}  " + "  ".join(f"{c:>16}" for c in cells),
              flush=True)
    print("cells: GPU-hours relative to the oracle, SLO-violation minutes / minutes")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sweep", action="store_true")
    args = ap.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
          f"{sys.version.split()[0]}")
    speed(args.repeat)
    if args.sweep:
        print()
        sweep((48.0, 40.0, 36.0, 32.0, 28.0))


if __name__ == "__main__":
    main()
