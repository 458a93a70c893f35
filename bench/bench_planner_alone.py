"""The planner alone on every load of ``bench_simulate.py``, and on loads kept fresh:
GPU-hours and SLO-violating minutes per load, in about a minute (no other policy, no
reference search) - what a change to the planner is judged by before the full benchmark.

Loads: the 24 of ``bench_simulate.py`` (the shipped trace x1-x8, every generated shape
with seeds 1 and 2), and, with ``--fresh`` (the default), 12 more that no planner default
was chosen on: the trace at x3 and x6, and seed 3 of every shape. Totals are printed for
each set apart: a change that only helps the benchmark's loads shows there.

The planner runs as ``bench_simulate.py`` runs it (``sim.scaler_adapter.planner_policy``:
the trigger metadata docs/planner.md writes, the HPA without a scale-down window);
``--metadata KEY=VALUE`` (repeatable) overrides trigger keys, e.g. ``utilization=0.92``.
Compare two versions of the planner by running this at each commit.

``--draws N``: every load with N cold-start draws (``ServingParams.cold_start_seed``
0..N-1; seed 0 is every other bench's draw). Each replica's cold start (80-300 s) is drawn
by its creation order, so a change that creates a replica at another moment meets another
start-up, and a single onset minute can flip on that alone: draw 0 is one sample. Per load
it prints the mean GPU-hours and the minutes of each draw; per set, each draw's totals and
their mean - what a change should be judged by (on 2026-12-07 the default planner's
benchmark minutes were 74 on draw 0 and 82-91 on draws 1-3).

Usage: .venv/bin/python bench/bench_planner_alone.py [--jobs N] [--no-fresh]
       [--metadata KEY=VALUE ...] [--draws N] [--cold-start-slot SECONDS]
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

from bench.bench_simulate import SHAPES, Case, cases
from gpuscale.models.serving import ServingParams
from gpuscale.sim.compare import opening
from gpuscale.sim.scaler_adapter import PlannerPolicy, planner_policy
from gpuscale.sim.simulate import Result, run_policy

FRESH_SEED = 3
FRESH_TRACE = (3.0, 6.0)


def fresh() -> list[Case]:
    """Loads no default was chosen on: other trace multiples, another seed."""
    return ([Case(f"trace x{n:g}", "trace", scale=n) for n in FRESH_TRACE] +
            [Case(f"{p} s{FRESH_SEED}", "pattern", pattern=p, seed=FRESH_SEED)
             for p in SHAPES])


def run_planner(case: Case, metadata: dict[str, str] | None = None,
                measure_startup: bool = False, params: ServingParams | None = None
                ) -> tuple[Result, PlannerPolicy, float]:
    """The planner on ``case`` as ``bench_simulate.py`` runs it (``params``: the serving
    model, its defaults unless given): (its result, the policy that ran, the duration
    simulated)."""
    requests = case.requests()
    duration = (requests[-1].arrival_s if requests else 0.0) + 300.0
    params = params or ServingParams()
    kwargs = planner_policy(params, 2.0, measure_startup, **(metadata or {}))
    result = run_policy("planner", requests, duration, params, min_replicas=1,
                        start=opening(requests, duration, params), **kwargs)
    return result, kwargs["signal"], duration


Row = tuple[str, float, int, int]  # (load, GPU-hours, SLO-violating minutes, cut requests)


def run(job: tuple[Case, tuple[tuple[str, str], ...], int, float]) -> Row:
    """One load at one cold-start draw (and its ``cold_start_slot_s``): (load, GPU-hours,
    SLO-violating minutes, requests cut by scale-downs)."""
    case, metadata, draw, slot_s = job
    result, _, _ = run_planner(case, dict(metadata), params=ServingParams(
        cold_start_seed=draw, cold_start_slot_s=slot_s))
    return case.name, result.gpu_hours, result.slo_violation_minutes, result.cut_requests


def table(name: str, draws: list[list[Row]]) -> list[str]:
    """One set's lines: per load (in the order run) its GPU-hours, minutes and cut requests
    - with several draws, the mean GPU-hours, the minutes of each draw and the cut summed -
    then the set's totals (with several draws, each draw's GPU-hours / minutes and their
    mean)."""
    head = f"{'load':<24}{'GPU-h':>8}{'SLO min':>9}{'cut':>6}"
    lines = ["", head, "-" * len(head)]
    n = len(draws)
    for rows in zip(*draws, strict=True):
        hours = sum(r[1] for r in rows) / n
        each = " ".join(str(r[2]) for r in rows)
        lines.append(f"{rows[0][0]:<24}{hours:>8.2f}{' ' + each:>9}{sum(r[3] for r in rows):>6d}")
    totals = [(sum(r[1] for r in rows), sum(r[2] for r in rows), sum(r[3] for r in rows))
              for rows in draws]
    if n == 1:
        hours, minutes, cut = totals[0]
        lines.append(f"{name + ' loads':<24}{hours:>8.2f}{minutes:>9d}{cut:>6d}")
        return lines
    per = "  ".join(f"{h:.2f} / {m}" for h, m, _ in totals)
    lines.append(f"{name + ' loads':<24}{sum(t[0] for t in totals) / n:>8.2f}"
                 f"{sum(t[1] for t in totals) / n:>9.1f}   (mean of {n} draws: {per})")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--no-fresh", dest="fresh", action="store_false")
    ap.add_argument("--metadata", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--draws", type=int, default=1)
    ap.add_argument("--cold-start-slot", type=float, default=0.0, metavar="SECONDS")
    args = ap.parse_args()
    if args.draws < 1 or args.cold_start_slot < 0:
        ap.error("--draws is at least 1, --cold-start-slot at least 0")
    metadata = tuple(tuple(kv.split("=", 1)) for kv in args.metadata)
    if any(len(kv) != 2 for kv in metadata):
        ap.error("--metadata takes KEY=VALUE")
    sets = [("benchmark", cases(False))] + ([("fresh", fresh())] if args.fresh else [])
    began = time.perf_counter()
    with ProcessPoolExecutor(max(1, args.jobs)) as pool:
        got = {name: [list(pool.map(run, [(c, metadata, d, args.cold_start_slot)
                                          for c in loads]))
                      for d in range(args.draws)]
               for name, loads in sets}
    print(f"# {platform.machine()} {os.cpu_count()} CPUs, Python "
          f"{sys.version.split()[0]}, {args.jobs} jobs, {time.perf_counter() - began:.0f} s"
          + (f", {args.draws} cold-start draws" if args.draws > 1 else "")
          + (f" by {args.cold_start_slot:g}-s slot" if args.cold_start_slot else "")
          + (f"; metadata {dict(metadata)}" if metadata else ""))
    for name, draws in got.items():
        print("\n".join(table(name, draws)))


if __name__ == "__main__":
    main()
