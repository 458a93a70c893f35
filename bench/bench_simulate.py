"""Every scaling policy on every load, against a lower bound: the planner's benchmark.

One table: load x policy -> GPU-hours, gap to the lower bound (``sim.fluid_bound``),
SLO-violating minutes (p95 time to first token <= 2 s per minute of arrivals), replica
changes per hour. Loads:

- the shipped Azure LLM conversation trace (one hour) at x1, x2, x4 and x8, the larger
  ones as superposed shifted copies of the trace (``scale_trace``);
- generated shapes (``traffic.patterns``): diurnal, steps, ramp, a sudden x10 burst,
  short bursty requests, long multi-turn prompts, and more.

Held out: the planner's defaults were chosen looking at the shipped trace and at
``bursts``/``diurnal`` with seed 1 (marked "tuned"); every other load (other shapes, and
seed 2 of all shapes) was run only after, and is reported apart ("held out").

Policies: gpuscale's planner (profile vllm-planner, through the scaler's own code:
``sim.scaler_adapter``), gpuscale's reactive vllm-inference profile, and what users run today
(``sim.baselines``, each from its documented defaults: static at the peak, CPU HPA,
the per-node GPU scaler, DCGM -> Prometheus -> adapter -> HPA, KEDA's Prometheus scaler on
vLLM's waiting requests, gpuscale's signal through Prometheus, Knative KPA, AIBrix KPA and
APA, a WVA-like queueing model). The bound is the least any policy could use (see
``sim.fluid_bound`` for why it is one).

Usage: .venv/bin/python bench/bench_simulate.py [--quick] [--jobs N]
  --quick: the shipped trace at x1 and x8 and two shapes (a few minutes on 2 cores)
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuscale.models.serving import ServingParams, needed_replicas
from gpuscale.models.slo import SLO_TTFT_S
from gpuscale.sim.baselines import baselines
from gpuscale.sim.fluid_bound import lower_bound
from gpuscale.sim.scaler_adapter import planner_policy
from gpuscale.sim.simulate import run_policy
from gpuscale.traffic.patterns import synthetic
from gpuscale.traffic.scale import scale_trace
from gpuscale.traffic.trace import TraceRequest, read_trace

TRACE = Path(os.environ.get("GPUSCALE_TRACE") or Path(__file__).resolve().parents[2] /
             "shared" / "traces" / "azure-llm-inference-2023-conv.csv")
SHAPE_RATE = 60.0  # requests/s at a shape's busiest: several replicas of an 8B model
SHAPE_S = 3600.0
TUNED_SHAPES = {("bursts", 1), ("diurnal", 1)}
SHAPES = ("diurnal", "bursts", "steps", "ramp", "burst10", "short-bursty", "long-prompts")


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    kind: str  # "trace" | "pattern"
    scale: float = 1.0  # trace: load multiple
    pattern: str = ""
    seed: int = 1
    tuned: bool = False

    def requests(self) -> list[TraceRequest]:
        if self.kind == "trace":
            return scale_trace(read_trace(TRACE), self.scale, 1.0, None)
        return synthetic(self.pattern, SHAPE_S, SHAPE_RATE, seed=self.seed)


@dataclass(frozen=True, slots=True)
class Row:
    case: str
    tuned: bool
    policy: str
    gpu_hours: float
    bound_hours: float
    slo_minutes: int
    minutes: int
    changes_per_hour: float
    unserved: int

    @property
    def gap(self) -> float:
        return self.gpu_hours / self.bound_hours - 1.0 if self.bound_hours > 0 else math.inf


def cases(quick: bool) -> list[Case]:
    loads = (1.0, 8.0) if quick else (1.0, 2.0, 4.0, 8.0)
    out = [Case(f"trace x{n:g}", "trace", scale=n, tuned=True) for n in loads]
    shapes = ("burst10", "steps") if quick else SHAPES
    seeds = (1,) if quick else (1, 2)
    for seed in seeds:
        for pattern in shapes:
            out.append(Case(f"{pattern} s{seed}", "pattern", pattern=pattern, seed=seed,
                            tuned=(pattern, seed) in TUNED_SHAPES))
    return out


def policies(params: ServingParams, requests: Sequence[TraceRequest],
             duration: float) -> list[tuple[str, dict[str, Any]]]:
    need = needed_replicas(requests, duration, params)
    start = max(need[:int(params.cold_start_s) + 1])  # what the opening minutes need
    return [("gpuscale vllm-planner", {**planner_policy(params), "start": start}),
            *baselines(params, peak=max(need), min_replicas=1, start=start)]


def run_case(case: Case) -> list[Row]:
    params = ServingParams()
    requests = case.requests()
    duration = (requests[-1].arrival_s if requests else 0.0) + 300.0
    bound = lower_bound(requests, duration, params, slo_s=SLO_TTFT_S)
    rows = []
    for name, kwargs in policies(params, requests, duration):
        r = run_policy(name, requests, duration, params, **kwargs)
        rows.append(Row(case.name, case.tuned, name, r.gpu_hours, bound.gpu_hours,
                        r.slo_violation_minutes, r.minutes, r.replica_changes_per_hour,
                        r.unserved))
    return rows


def table(rows: Sequence[Row]) -> str:
    head = (f"{'load':<16}{'policy':<40}{'GPU-h':>8}{'vs bound':>10}{'SLO min':>10}"
            f"{'changes/h':>11}{'unserved':>10}")
    lines = [head, "-" * len(head)]
    last = ""
    for r in rows:
        if r.case != last:
            lines.append(f"{r.case:<16}{'lower bound':<40}{r.bound_hours:>8.2f}")
            last = r.case
        lines.append(f"{'':<16}{r.policy:<40}{r.gpu_hours:>8.2f}{r.gap:>+10.0%}"
                     f"{r.slo_minutes:>6}/{r.minutes:<3}{r.changes_per_hour:>11.1f}"
                     f"{r.unserved:>10}")
    return "\n".join(lines)


def summary(rows: Sequence[Row]) -> str:
    """Per policy, over the tuned and the held-out loads: SLO minutes in all, the median
    gap to the bound, and on how many loads it was the best policy (fewest SLO minutes,
    then fewest GPU-hours; ties within 0.5 % count for each)."""
    names = list(dict.fromkeys(_family(r.policy) for r in rows))
    best: dict[str, int] = dict.fromkeys(names, 0)
    for case in dict.fromkeys(r.case for r in rows):
        mine = [r for r in rows if r.case == case]
        top = min(mine, key=lambda r: (r.slo_minutes, r.gpu_hours))
        for r in mine:  # ties (within 0.5 % of the GPU-hours) count for each
            if r.slo_minutes == top.slo_minutes and r.gpu_hours <= top.gpu_hours * 1.005:
                best[_family(r.policy)] += 1
    head = (f"{'policy':<40}{'SLO min tuned':>14}{'held out':>10}{'median gap':>12}"
            f"{'best on':>9}")
    lines = [head, "-" * len(head)]
    for name in names:
        mine = [r for r in rows if _family(r.policy) == name]
        gaps = sorted(r.gap for r in mine)
        tuned = sum(r.slo_minutes for r in mine if r.tuned)
        held = sum(r.slo_minutes for r in mine if not r.tuned)
        lines.append(f"{name:<40}{tuned:>14}{held:>10}{gaps[len(gaps) // 2]:>+12.0%}"
                     f"{best[name]:>9}")
    return "\n".join(lines)


def _family(policy: str) -> str:
    """The policy without its per-load detail ("static at peak (5)" -> "static at peak")."""
    if policy.startswith("static at peak"):
        return "static at peak"
    return policy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
          f"{sys.version.split()[0]}; {args.jobs} worker processes", flush=True)
    t0 = time.perf_counter()
    todo = cases(args.quick)
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(run_case, todo))
    rows = [r for case_rows in results for r in case_rows]
    print(table(rows))
    print()
    print(summary(rows))
    print(f"\n{len(todo)} loads x {len(results[0]) if results else 0} policies in "
          f"{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
