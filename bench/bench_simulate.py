"""gpuscale simulate speed and the vllm-inference profile's sensitivity, for BENCHMARKS.md.

Part 1 - speed. The issue's target: a one-hour trace with ~20k requests and six policies
in under a minute. The shipped Azure conversation trace at its own rate is 19,366 requests
over one hour; ``compare`` runs the six policies (the oracle's search included). Reports
the wall time of the whole and of the oracle's search, best of ``--repeat``.

Part 2 - sensitivity (``--sweep``). The vllm-inference profile's requests target (with its
KV-cache target) against the oracle on the trace at 2x, 4x and 8x and two synthetic
patterns: GPU-hours relative to the oracle and SLO-violation minutes, per target.

Part 3 - explorations (``--explore``), for the burst problem, on the same loads with
targets 32 and 40: (a) the HPA's scale-down stabilization window at 120 s and 60 s instead
of 300 s; (b) a Little's-law demand signal instead of requests in the server: arrivals
(completions + growth of requests in the system, over 30 s) x service time (running /
completion rate), plus the waiting requests spread over a 120 s drain.

Usage: .venv/bin/python bench/bench_simulate.py [--repeat 3] [--sweep] [--explore]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

from gpuscale.control.hpa import SCALE_DOWN, Metric, MetricSource, Rules, TargetType
from gpuscale.control.serving import ServingModel, ServingParams
from gpuscale.control.simulate import (
    Signal,
    compare,
    oracle_plan,
    profile_signal,
    run_policy,
    scale_trace,
    synthetic,
)
from gpuscale.telemetry.load import TraceRequest, read_trace

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

    def both(model: ServingModel, now: float) -> list[Metric]:
        return requests(model, now) + kv(model, now)
    return both


def _demand(target: float, window_s: float = 30.0, drain_s: float = 120.0) -> Signal:
    """The Little's-law prototype (fleet-wide; a real one would run per pod in the agent
    from vLLM's request_success_total)."""
    kv = profile_signal({"signal": "vllm-kv-cache", "targetValue": "80"})
    history: list[tuple[float, int, int]] = []

    def signal(model: ServingModel, now: float) -> list[Metric]:
        ready = [r for r in model.replicas if now >= r.ready_at]
        running = sum(len(r.running) for r in ready)
        in_system = len(model.queue) + sum(len(r.running)
                                           for r in model.replicas + model.draining)
        history.append((now, in_system, len(model.done)))
        while history[0][0] < now - window_s:
            history.pop(0)
        t0, n0, done0 = history[0]
        finished = len(model.done) - done0
        value = float(running + len(model.queue))
        if now > t0 and finished > 0:
            rate = finished / (now - t0)
            arrivals = max(0.0, rate + (in_system - n0) / (now - t0))
            service = running / rate
            value = arrivals * service + len(model.queue) * service / drain_s
        return [Metric(MetricSource.EXTERNAL, TargetType.AVERAGE_VALUE, target, value),
                *kv(model, now)]
    return signal


def _cases() -> list[tuple[str, list[TraceRequest]]]:
    trace = read_trace(TRACE)
    cases: list[tuple[str, list[TraceRequest]]] = [
        (f"trace x{r:g}", scale_trace(trace, r, 1.0, None)) for r in (2.0, 4.0, 8.0)]
    return [*cases, ("diurnal 30 req/s", synthetic("diurnal", 3600.0, 30.0)),
            ("bursts 30 req/s", synthetic("bursts", 3600.0, 30.0))]


def sweep(targets: tuple[float, ...], signal: Callable[[float], Signal] | None = None,
          title: str = "", scale_down: Rules = SCALE_DOWN) -> None:
    params = ServingParams()
    make = signal or _profile
    if title:
        print(title)
    print(f"{'load':<18}{'oracle GPU-h':>13}  " + "  ".join(
        f"{'target ' + format(t, 'g'):>16}" for t in targets))
    for name, requests in _cases():
        duration = requests[-1].arrival_s + 300.0
        plan, oracle = oracle_plan(requests, duration, params)
        start = max(plan[:int(params.cold_start_s) + 1])
        cells = []
        for t in targets:
            r = run_policy("v", requests, duration, params, make(t), start=start,
                           scale_down=scale_down)
            cells.append(f"{r.gpu_hours / oracle.gpu_hours - 1:+5.0%} {r.slo_violation_minutes:3d}"
                         f"/{r.minutes:<3d}")
        print(f"{name:<18}{oracle.gpu_hours:>13.2f}  " + "  ".join(f"{c:>16}" for c in cells),
              flush=True)
    print("cells: GPU-hours relative to the oracle, SLO-violation minutes / minutes")


def explore() -> None:
    for window in (120.0, 60.0):
        sweep((32.0, 40.0), title=f"\nscale-down stabilization {window:g} s (default 300)",
              scale_down=dataclasses.replace(SCALE_DOWN, stabilization_s=window))
    sweep((32.0, 40.0), _demand, "\nLittle's-law demand signal (+ KV cache 80 %)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--explore", action="store_true")
    args = ap.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
          f"{sys.version.split()[0]}")
    speed(args.repeat)
    if args.sweep:
        print()
        sweep((48.0, 40.0, 36.0, 32.0, 28.0))
    if args.explore:
        explore()


if __name__ == "__main__":
    main()
