"""The same scripted load through the models of KEDA and the HPA (``gpuscale.models``,
what ``./dev run`` and the simulator stand on) and through the real control plane; the
two replica trajectories side by side.

The load is requests in flight to the workload (``./dev cluster load``). The scaler's
answer is what the Ready pods' engines report: the whole load once one pod is Ready,
about two seconds after it changes (the engine, the agent's 1 s sample, the stream)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpuscale.models.hpa import Metric, MetricSource, TargetType
from gpuscale.models.keda import ScaledObjectLoop, scaled_object_spec

ANSWER_LAG_S = 2.0  # engine -> agent sample -> stream -> scaler
READY_AFTER_S = 4.0  # kwok's pod-started + the ready delay the workloads set (3 s) + a tick


@dataclass(frozen=True, slots=True)
class Step:
    at: float  # seconds from the start
    in_flight: int


def load_at(script: Sequence[Step], t: float) -> int:
    now = [s.in_flight for s in script if s.at <= t]
    return now[-1] if now else 0


def model_trajectory(spec: dict[str, Any], target: float, script: Sequence[Step],
                     duration: float, every: float = 5.0, start: int = 1) -> list[int]:
    """Replicas sampled every ``every`` seconds from the models, stepping one second."""
    loop = ScaledObjectLoop(scaled_object_spec(spec))
    ready_at: list[float] = [-READY_AFTER_S] * start
    out: list[int] = []
    t = 0.0
    while t <= duration:
        replicas = len(ready_at)
        ready = sum(1 for r in ready_at if r <= t)
        load = load_at(script, t - ANSWER_LAG_S)
        if loop.due(t, replicas):
            metric = Metric(MetricSource.EXTERNAL, TargetType.AVERAGE_VALUE, target,
                            value=float(load) if ready else 0.0)
            desired = loop.decide(t, replicas, ready, [metric], load > 0)
            if desired > replicas:
                ready_at += [t + READY_AFTER_S] * (desired - replicas)
            elif desired < replicas:  # a Deployment removes the youngest pods first
                ready_at = sorted(ready_at)[:desired]
        if abs(t / every - round(t / every)) < 1e-9:
            out.append(len(ready_at))
        t += 1.0
    return out


def real_trajectory(set_load: Callable[[int], None], replicas: Callable[[], int],
                    script: Sequence[Step], duration: float,
                    every: float = 5.0) -> list[int]:
    """Replicas read from the API every ``every`` seconds while the script plays."""
    start = time.monotonic()
    out: list[int] = []
    pending = sorted(script, key=lambda s: s.at)
    for k in range(int(duration // every) + 1):
        time.sleep(max(0.0, start + k * every - time.monotonic()))
        while pending and pending[0].at <= k * every:  # at its time, not a sample early
            set_load(pending.pop(0).in_flight)
        out.append(replicas())
    return out


def table(script: Sequence[Step], model: Sequence[int], real: Sequence[int],
          every: float = 5.0) -> str:
    """Markdown: time, load, model, real, and a mark where they differ."""
    rows = ["| t (s) | in flight | model | real | |", "|---:|---:|---:|---:|---|"]
    for k, (m, r) in enumerate(zip(model, real, strict=False)):
        t = k * every
        rows.append(f"| {t:.0f} | {load_at(script, t)} | {m} | {r} | {'' if m == r else '≠'} |")
    return "\n".join(rows)
