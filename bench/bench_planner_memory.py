"""What one workload's planner holds in memory once its windows are full.

Observes ``--planners`` planners of ``--pods`` Ready pods each, once a second for
``--seconds`` seconds (longer than every window the planner keeps: 15 minutes of bursts,
5 of trend and KV), and prints the memory tracemalloc sees per planner. The plan book keeps
at most 1,000 planners (``scaler.state.plan_book.MAX_WORKLOADS``).

Usage: .venv/bin/python bench/bench_planner_memory.py [--planners 20] [--pods 8]
"""

from __future__ import annotations

import argparse
import tracemalloc

from gpuscale.scaler.core.planner import Observation, Planner, PlannerConfig, PodLoad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--planners", type=int, default=20)
    ap.add_argument("--pods", type=int, default=8)
    ap.add_argument("--seconds", type=int, default=1200)
    args = ap.parse_args()
    pods = tuple(PodLoad(f"llm/vllm-{i}", 3_000.0, 1_200.0, 0.0) for i in range(args.pods))
    obs = Observation(3_000.0 * args.pods, 1_200.0 * args.pods, 2.0 * args.pods, 0.0,
                      5.0 * args.pods, 20.0 * args.pods, args.pods, 0, pods)
    tracemalloc.start()
    kept = []
    for _ in range(args.planners):
        planner = Planner(PlannerConfig())
        for t in range(args.seconds):
            planner.observe(float(t), obs)
        kept.append(planner)
    current, _ = tracemalloc.get_traced_memory()
    per = current / args.planners / 1024
    print(f"{per:.0f} KiB per planner ({args.planners} planners, {args.pods} pods each, "
          f"{args.seconds} s observed); {per * 1000 / 1024:.0f} MiB at 1,000 workloads")


if __name__ == "__main__":
    main()
