"""The planner's knob over several cold-start draws: is a reversal the draw or the mechanism?

``bench_frontier.py`` judges the knob (``utilization``, ``sim.sweep.KNOBS``) on one run per
setting, and each run draws its replicas' cold starts (80-300 s, ``ServingParams``) by
creation order: two settings that create replicas at other moments meet other start-ups,
and a minute can flip on that alone. This bench runs the planner at every setting of its
knob on every load of the benchmark (``bench_simulate.cases``) with ``--draws`` cold-start
seeds (``ServingParams.cold_start_seed`` 0..N-1; seed 0 is every other bench's draw) and
prints, per load: the mean GPU-hours / SLO minutes at each setting, whether those means are
monotone (GPU-hours never rise, minutes never fall as the knob rises), and on how many of
the draws the runs themselves are. A reversal on the means is the planner's, not the draw's.

Usage: .venv/bin/python bench/bench_knob_draws.py [--draws 5] [--jobs N] [--loads A,B]
           [--json FILE] [--cold-start-slot SECONDS]
  --loads: names as printed, '-' for a space ("trace-x2,bursts-s1")
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.bench_frontier import knob_monotone, pick_loads  # noqa: E402
from bench.bench_planner_alone import run_planner  # noqa: E402
from bench.bench_simulate import Case, cases  # noqa: E402
from gpuscale.models.serving import ServingParams  # noqa: E402
from gpuscale.sim.sweep import KNOBS, PLANNER  # noqa: E402

SETTINGS = KNOBS[PLANNER].settings


@dataclass(frozen=True, slots=True)
class Run:
    load: str
    setting: float
    draw: int
    gpu_hours: float
    slo_minutes: int


@dataclass(frozen=True, slots=True)
class LoadVerdict:
    load: str
    means: tuple[tuple[float, float, float], ...]  # (setting, GPU-hours, minutes), rising
    mean_monotone: bool
    draws_monotone: int  # draws on which the runs themselves are monotone
    draws: int


def verdicts(runs: Iterable[Run]) -> list[LoadVerdict]:
    """Per load (in the order first seen): the knob's means and its monotony."""
    by: dict[str, dict[float, dict[int, Run]]] = {}
    for r in runs:
        by.setdefault(r.load, {}).setdefault(r.setting, {})[r.draw] = r
    out = []
    for load, settings in by.items():
        order = sorted(settings)
        draws = sorted(set.intersection(*(set(settings[s]) for s in order)))
        means = tuple((s, sum(settings[s][d].gpu_hours for d in draws) / len(draws),
                       sum(settings[s][d].slo_minutes for d in draws) / len(draws))
                      for s in order)
        per = sum(knob_monotone([(settings[s][d].gpu_hours, settings[s][d].slo_minutes)
                             for s in order]) for d in draws)
        out.append(LoadVerdict(load, means, knob_monotone([(h, m) for _, h, m in means]), per,
                               len(draws)))
    return out


def _run(job: tuple[Case, float, int, float]) -> Run:
    case, setting, draw, slot_s = job
    result, _, _ = run_planner(case, {"utilization": f"{setting:g}"}, params=ServingParams(
        cold_start_seed=draw, cold_start_slot_s=slot_s))
    return Run(case.name, setting, draw, result.gpu_hours, result.slo_violation_minutes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--loads", default="")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--cold-start-slot", type=float, default=0.0, metavar="SECONDS")
    args = ap.parse_args()
    if args.draws < 1 or args.cold_start_slot < 0:
        ap.error("--draws is at least 1, --cold-start-slot at least 0")
    loads = cases(False)
    if args.loads:
        loads = pick_loads(loads, args.loads)
    jobs = [(c, s, d, args.cold_start_slot) for c in loads for s in SETTINGS
            for d in range(args.draws)]
    began = time.perf_counter()
    with ProcessPoolExecutor(max(1, args.jobs)) as pool:
        runs = list(pool.map(_run, jobs, chunksize=2))
    print(f"# {platform.machine()} {os.cpu_count()} CPUs, Python "
          f"{sys.version.split()[0]}, {args.jobs} jobs, {args.draws} cold-start draws"
          f"{f' by {args.cold_start_slot:g}-s slot' if args.cold_start_slot else ''}, "
          f"{time.perf_counter() - began:.0f} s")
    found = verdicts(runs)
    for v in found:
        means = "  ".join(f"{s:g} {h:.2f} / {m:.1f}" for s, h, m in v.means)
        print(f"{v.load:<24} means {'monotone' if v.mean_monotone else 'NOT     '}  draws "
              f"monotone {v.draws_monotone}/{v.draws}  {means}")
    first = verdicts(r for r in runs if r.draw == 0)
    print(f"monotone on the means: {sum(v.mean_monotone for v in found)} of {len(found)}; "
          f"on every draw: {sum(v.draws_monotone == v.draws for v in found)}; on draw 0 "
          f"(bench_frontier's): {sum(v.mean_monotone for v in first)}")
    if args.json:
        args.json.write_text(json.dumps([[r.load, r.setting, r.draw, r.gpu_hours,
                                          r.slo_minutes] for r in runs]))


if __name__ == "__main__":
    main()
