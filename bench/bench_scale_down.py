"""What a scale-down costs in-flight requests, and what choosing the pod or the grace period
buys: the planner on loads whose requests outlast a pod's termination grace.

For each load, the planner (as ``bench_simulate.py`` runs it) with:

- the ReplicaSet's default choice of pod (not Ready first, then the youngest) or the idlest
  (``controller.kubernetes.io/pod-deletion-cost`` from each pod's running requests);
- Kubernetes' default ``terminationGracePeriodSeconds`` (30 s) or 600 s;
- requests routed to the least loaded pod (a gateway balancing on outstanding requests) or
  in turn (a Service's kube-proxy, a gateway that does not look at load);

and prints GPU-hours, SLO-violating minutes and the requests a drain's deadline cut off
(they start over from the queue, their time to first token counted from their arrival).
Loads: the generated ``reasoning`` shape (~6,000-token outputs), seeds 1 and 2, and the
shipped trace x4 and ``steps`` (ordinary requests, for contrast).

Usage: .venv/bin/python bench/bench_scale_down.py
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

from gpuscale.models.serving import ServingParams
from gpuscale.sim.compare import opening
from gpuscale.sim.scaler_adapter import planner_policy
from gpuscale.sim.simulate import run_policy
from gpuscale.traffic.patterns import synthetic
from gpuscale.traffic.scale import scale_trace
from gpuscale.traffic.trace import TraceRequest, read_trace

REPO = Path(__file__).resolve().parent.parent
TRACE = Path(os.environ.get("GPUSCALE_TRACE") or
             REPO / "traces" / "azure-llm-inference-2023-conv.csv")  # traces/README.md


def loads() -> list[tuple[str, list[TraceRequest]]]:
    return [("reasoning s1", synthetic("reasoning", 3600.0, 60.0, seed=1)),
            ("reasoning s2", synthetic("reasoning", 3600.0, 60.0, seed=2)),
            ("trace x4", scale_trace(read_trace(TRACE), 4.0, 1.0, None)),
            ("steps s1", synthetic("steps", 3600.0, 60.0, seed=1))]


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
          f"{sys.version.split()[0]}")
    t0 = time.perf_counter()
    head = (f"{'load':<14}{'routing':>9}{'grace s':>8}{'pod chosen':>12}{'GPU-h':>8}"
            f"{'SLO min':>9}{'cut':>6}")
    print(head)
    print("-" * len(head))
    for name, requests in loads():
        duration = requests[-1].arrival_s + 300.0
        for rr in (False, True):
            for grace in (30.0, 600.0):
                params = replace(ServingParams(), drain_s=grace)
                start = opening(requests, duration, params)
                for idlest in (False, True):
                    r = run_policy("planner", requests, duration, params,
                                   idlest_first=idlest, round_robin=rr,
                                   **{**planner_policy(params), "start": start})
                    print(f"{name:<14}{'in turn' if rr else 'least':>9}{grace:>8.0f}"
                          f"{'idlest' if idlest else 'youngest':>12}{r.gpu_hours:>8.2f}"
                          f"{r.slo_violation_minutes:>9}{r.cut_requests:>6}", flush=True)
    print(f"\n{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
