"""The HPA behavior a planner's ScaledObject (``advanced.horizontalPodAutoscalerConfig
.behavior``) or HPA (``spec.behavior``) sets - one place: docs/planner.md, the examples in
deploy/examples, the simulator and the demo's HPA path all take it from here (a test holds
the examples to it).

- ``scaleDown.stabilizationWindowSeconds: 0``: the planner holds its own plan for a
  start-up; the HPA's 300 s on top only bills idle replicas.
- ``tolerance: 0`` both ways (Kubernetes 1.35+, HPAConfigurableTolerance: beta and on by
  default in 1.35, GA in 1.37; KEDA 2.18+ passes it to its HPA - kedacore/keda-docs#1660;
  an older API server or KEDA drops the field and the HPA keeps its 10 %):
  the planner's value is an exact count (``planned x targetValue``, ``AverageValue``), and
  the HPA's default tolerance keeps the current count while the ratio is within 10 %. On
  a pool of 10 or more that ignores a plan one replica away: up - the replica the SLO
  needed is not asked for - and down - one the plan gave back keeps running. Measured
  (``bench/bench_planner_alone.py``, 2026-11-28): `long-prompts` (18-21 replicas) was held
  at 21 where the plan said 20 for the whole hour; at tolerance 0, -0.8 GPU-hours an hour
  on each seed (seed 1 one SLO minute fewer), `bursts` -0.2, the 24 benchmark loads
  126.93 -> 125.26 GPU-hours at the same 75 SLO minutes (`long-prompt-bursts` seed 1
  one minute more, 14 -> 15, and +0.24 GPU-hours: not traced); the 12 fresh loads 67.09
  -> 66.72 at 21.
"""

from __future__ import annotations

import json
from typing import Any

from gpuscale.models.hpa import SCALE_DOWN, SCALE_UP, Rules, parse_behavior

PLANNER_BEHAVIOR: dict[str, Any] = {
    "scaleUp": {"tolerance": 0},
    "scaleDown": {"stabilizationWindowSeconds": 0, "tolerance": 0},
}


def planner_rules() -> tuple[Rules, Rules]:
    """(scale-up, scale-down) rules of ``PLANNER_BEHAVIOR`` as the API server completes
    them (its defaults for what the behavior leaves out)."""
    up, down = parse_behavior(json.dumps(PLANNER_BEHAVIOR))
    return up or SCALE_UP, down or SCALE_DOWN  # (a behavior given: neither is None)
