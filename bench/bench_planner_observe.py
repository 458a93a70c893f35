"""The planner's CPU per observation, for BENCHMARKS.md: one planner fed a synthetic
day-shaped load (a slow wave with a fast ripple, rising and falling, so the hold's
falling path runs too) for ``--seconds`` observations, reported as microseconds per
``Planner.observe``, beside a yardstick from the same run: pushing the same number of
values into the planner's own ``Window`` eight times (the per-second bookkeeping every
observation does at least). ``--excesses N`` also times the burst term alone with N
recurring bursts' excesses remembered (one a 10-s bucket: at most 120 in the default
20-minute memory; the benchmark loads keep up to ~36), which every observation reads.

To compare two versions of the planner, run it with each tree first on ``PYTHONPATH``
(``git worktree add /tmp/old REV``; ``PYTHONPATH=/tmp/old/src .venv/bin/python
bench/bench_planner_observe.py``), alternately, and quote the medians.

Usage: .venv/bin/python bench/bench_planner_observe.py [--seconds 20000] [--repeat 5]
       [--excesses 30,120]
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import sys
import time
from collections import deque

from gpuscale.scaler.core.bursts import BURST_BUCKET_S, Bursts
from gpuscale.scaler.core.planner import Observation, Planner, PlannerConfig
from gpuscale.scaler.core.windows import Window

CONFIG = PlannerConfig(startup_s=300.0)
REQUEST = CONFIG.work(CONFIG.prompt_tokens, CONFIG.output_tokens)  # the default request


def _observation(t: int) -> Observation:
    load = 3.0 + 2.0 * math.sin(2 * math.pi * t / 3600) + 0.3 * math.sin(t / 7.0)
    return Observation(prompt_tps=load / 2 * CONFIG.prefill_tps,
                       generation_tps=load / 2 * CONFIG.decode_tps,
                       finished_rate=load / REQUEST, waiting=0.0, running=load * 8,
                       kv_cache=load * 10, ready=6, starting=0)


def planner_us(seconds: int) -> float:
    observations = [_observation(t) for t in range(seconds)]
    planner = Planner(CONFIG)
    began = time.perf_counter()
    for t, obs in enumerate(observations):
        planner.observe(float(t), obs)
    return (time.perf_counter() - began) / seconds * 1e6


def yardstick_us(seconds: int) -> float:
    windows = [Window(300, slopes=True) for _ in range(8)]
    began = time.perf_counter()
    for t in range(seconds):
        for window in windows:
            window.push(float(t % 17))
    return (time.perf_counter() - began) / seconds * 1e6


def burst_term_us(excesses: int, calls: int = 20_000) -> float:
    """The burst term read once with ``excesses`` recurring bursts remembered over the
    memory, every age from new to about to go."""
    bursts = Bursts(CONFIG)
    second = 10 * int(CONFIG.memory_s)
    step = max(1, int(CONFIG.memory_s) // max(excesses, 1))
    bursts.excess = deque((second - int(CONFIG.memory_s) + 1 + step * i, 1.0 + i % 7, 9.0)
                          for i in range(excesses))
    bursts.rates = deque([(second - BURST_BUCKET_S, 9.0, 9.0)])
    began = time.perf_counter()
    for _ in range(calls):
        bursts.term(2.0, second, 300.0, 300.0)
    return (time.perf_counter() - began) / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--excesses", default="", help="e.g. 30,120: time the burst term alone")
    args = ap.parse_args()
    plans = [planner_us(args.seconds) for _ in range(args.repeat)]
    sticks = [yardstick_us(args.seconds) for _ in range(args.repeat)]
    print(f"{platform.machine()}, Python {sys.version.split()[0]}; {args.seconds} "
          f"observations x {args.repeat}")
    print(f"planner: {statistics.median(plans):.1f} us per observation (min "
          f"{min(plans):.1f}); yardstick, 8 window pushes: {statistics.median(sticks):.1f} "
          f"us (min {min(sticks):.1f})")
    for n in (int(v) for v in args.excesses.split(",") if v):
        runs = [burst_term_us(n) for _ in range(args.repeat)]
        print(f"burst term with {n} remembered excesses: {statistics.median(runs):.1f} us "
              f"(min {min(runs):.1f})")


if __name__ == "__main__":
    main()
