"""Which of the planner's terms sets its count, how much of the time, and what it costs.

Runs the planner alone (as ``gpuscale simulate`` runs it: ``sim.compare.policy_runs``'s
keyword arguments, the opening replicas warm) on a few loads and reads its plan every
simulated second. For each second it names the **setter** - the term whose value is the
plan: ``steady``, ``burst``, ``concurrency``, ``kv``, ``current`` (the work served over the
last 10 s), or ``hold:<term>`` (the plan is a count held from an earlier second, where
<term> set it), ``warming`` (the pods that exist, before a whole hold window is seen),
``drain`` (the drain floor) - and the replicas it adds over the steady term's own count
(``ceil(steady + backlog)``). Prints, per load: GPU-hours and SLO-violating minutes (the
objective of ``gpuscale simulate``), each setter's share of the seconds, and the
replica-hours each setter plans over the steady term.

Usage: .venv/bin/python bench/bench_planner_terms.py [--loads conv-x2,conv-x4,burst10]
           [--set utilization=0.95 ...] [--duration S] [--seeds 1] [--rate-mode rotate]
A load is ``conv-xN`` (the shipped trace, ``traffic.scale.scale_trace`` at xN, by default
``--rate-mode rotate``: the copies circularly shifted, as issue 40 measured) or a
generated shape's name (``traffic.patterns``, at 60 requests/s as ``bench_simulate.py``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from collections import Counter, deque
from pathlib import Path
from typing import Any

from gpuscale.models.serving import ServingModel, ServingParams
from gpuscale.models.slo import DEFAULT_SLO
from gpuscale.scaler.core.planner import Plan
from gpuscale.sim.compare import opening, policy_runs
from gpuscale.sim.simulate import run_policy
from gpuscale.traffic.patterns import synthetic
from gpuscale.traffic.scale import RATE_MODES, RateMode, scale_trace
from gpuscale.traffic.trace import TraceRequest, read_trace

TRACE = Path(__file__).resolve().parents[1] / "traces" / "azure-llm-inference-2023-conv.csv"
TERMS = ("steady", "burst", "concurrency", "kv", "current")
FLIP_S = 60.0  # a plan that falls within this of rising counts as a flip (see the docstring)


def load(name: str, seed: int, duration: float | None,
         rate_mode: RateMode = "rotate") -> tuple[list[TraceRequest], float]:
    if name.startswith("conv-x"):
        reqs = scale_trace(read_trace(TRACE), float(name[6:]), 1.0, duration, mode=rate_mode)
    else:
        reqs = synthetic(name, duration or 3600.0, 60.0, seed=seed)
    end = reqs[-1].arrival_s + 300.0 if duration is None else duration
    return reqs, end


def setter(p: Plan) -> str:
    """The term that is the plan's ``required`` less its backlog (before the hold)."""
    top = p.required - p.backlog
    for name, value in (("steady", p.steady), ("burst", p.burst),
                        ("concurrency", p.concurrency), ("kv", p.kv)):
        if abs(value - top) < 1e-9:
            return name
    return "current"


def here_setter(p: Plan, utilization: float, kv_target: float, burst_held: bool) -> str:
    """The term the hold keeps from this second (the load that is here: steady and kv
    without their growth; the burst term only where its memory is shorter than the hold,
    as ``Planner._make``)."""
    values = {"steady": p.steady - p.growth / utilization / p.capacity,
              "burst": p.burst if burst_held else 0.0,
              "concurrency": p.concurrency, "kv": p.kv - p.kv_growth / kv_target}
    name = max(values, key=lambda k: values[k])
    return name if math.ceil(values[name] - 1e-9) >= p.held else "current"


class Recorder:
    """Reads the planner's plan once a simulated second (after its own tick)."""

    def __init__(self, policy: Any, tick: Any) -> None:
        self.policy, self._tick = policy, tick
        self.seconds: Counter[str] = Counter()
        self.extra: Counter[str] = Counter()  # replica-seconds over the steady count
        self.planned = 0.0
        self._held: deque[tuple[float, int, str]] = deque()
        self.flips = 0  # plans that fell within FLIP_S of rising (a pod asked for, given back)
        self._last = (0.0, 0)  # (when the plan last rose, the plan)

    def __call__(self, model: ServingModel, now: float, replicas: int) -> int | None:
        self._tick(model, now, replicas)
        p = self.policy.plan(now)
        if not isinstance(p, Plan):
            return None
        base = math.ceil(p.steady + p.backlog - 1e-9)
        c = self.policy._sim.trigger.planner
        held_by = here_setter(p, c.utilization, c.kv_target, c.memory_s < self.policy.hold_s)
        while self._held and self._held[-1][1] <= p.held:
            self._held.pop()
        self._held.append((now, p.held, held_by))
        while len(self._held) > 1 and self._held[0][0] <= now - self.policy.hold_s:
            self._held.popleft()  # keeps this second's own (a hold of 0 s holds nothing)
        if p.drain_floor:
            who = "drain"
        elif p.replicas > max(p.unheld, self._held[0][1]):
            who = "warming"
        elif p.replicas > p.unheld:
            who = "hold:" + self._held[0][2]
        else:
            who = setter(p)
        self.seconds[who] += 1
        rose_at, last = self._last
        if p.replicas > last:
            rose_at = now
        elif p.replicas < last and now - rose_at <= FLIP_S:
            self.flips += 1
        self._last = (rose_at, p.replicas)
        self.extra[who] += max(0, p.replicas - base)
        self.planned += p.replicas
        return None


def run(name: str, seed: int, duration: float | None, metadata: dict[str, str],
        rate_mode: RateMode = "rotate") -> dict[str, Any]:
    params = ServingParams()
    reqs, end = load(name, seed, duration, rate_mode)
    start = opening(reqs, end, params)
    runs = dict(policy_runs(params, reqs, DEFAULT_SLO, 1, start))
    kwargs = dict(runs["planner"])
    if metadata:  # the same policy with these trigger keys set
        from gpuscale.sim.scaler_adapter import planner_policy
        kwargs.update(planner_policy(params, DEFAULT_SLO.target_s, False, **metadata))
    policy = kwargs["signal"]
    c = policy._sim.trigger.planner
    policy.hold_s = c.hold_s if c.hold_s is not None else (c.startup_s or 300.0)
    rec = Recorder(policy, kwargs["decider"])
    kwargs["decider"] = rec
    kwargs.pop("name")
    t0 = time.monotonic()
    r = run_policy("planner", reqs, end, params, **kwargs)
    total = sum(rec.seconds.values()) or 1
    return {"load": name if name.startswith("conv") else f"{name} s{seed}",
            "gpu_hours": round(r.gpu_hours, 3), "slo_min": r.slo_violation_minutes,
            "planned_replica_hours": round(rec.planned / 3600, 3), "flips": rec.flips,
            "setter_share": {k: round(v / total, 3) for k, v in rec.seconds.most_common()},
            "over_steady_replica_hours": {k: round(v / 3600, 3)
                                          for k, v in rec.extra.most_common() if v},
            "seconds": round(time.monotonic() - t0, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--loads", default="conv-x2,conv-x4,burst10")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1])
    ap.add_argument("--duration", type=float, default=None)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--rate-mode", choices=RATE_MODES, default="rotate",
                    help="how conv-xN scales the trace (traffic.scale; default rotate: "
                         "the loads issue 40 measured)")
    args = ap.parse_args()
    metadata = dict(kv.split("=", 1) for kv in args.set)
    print(f"# {platform.machine()}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
          f"{time.strftime('%Y-%m-%d')}; planner keys {metadata or 'default'}", flush=True)
    for name in args.loads.split(","):
        for seed in (args.seeds if not name.startswith("conv") else [1]):
            got = run(name, seed, args.duration, metadata, args.rate_mode)
            if args.json:
                print(json.dumps(got), flush=True)
                continue
            print(f"{got['load']:<16} {got['gpu_hours']:6.2f} GPU-h {got['slo_min']:3d} SLO min"
                  f"  planned {got['planned_replica_hours']:.2f} replica-h, {got['flips']} flips"
                  f"  set by {got['setter_share']}  over steady "
                  f"{got['over_steady_replica_hours']}  ({got['seconds']} s)", flush=True)


if __name__ == "__main__":
    main()
