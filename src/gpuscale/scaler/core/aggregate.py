"""The number KEDA gets: a workload's pods' signal, aggregated the way the HPA needs it.

With KEDA's default AverageValue target T, the HPA computes desired = ceil(value / T), so
``value`` must be the SUM over the workload's pods of the per-pod signal: then desired is
the number of pods that would each run at the target. (An average or a maximum would give
ceil(u / T) <= 2 for any target above half the signal's range: a loaded fleet could never
scale out.) With ``metricType: Value`` the HPA computes desired = ceil(ready x value / T),
so the value must be the AVERAGE over the READY pods (the HPA multiplies by its count of
Ready pods): the sum over every pod that reports, divided by the Ready ones, so that
ready x value is the whole load even while a loaded pod is briefly not Ready.

Missing data never shrinks the sum. A Ready pod whose signal is absent, unsupported or
older than the staleness bound makes the answer UNAVAILABLE, naming the pods and why, so
KEDA applies its fallback. Pods that are not Ready yet and have no data are left out: they
are starting and carry no load (once they report, they count). A reading that cannot be
true - negative, not finite, or above the signal's plausible bound - is a broken peer:
the pod is unusable (UNAVAILABLE), never summed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from gpuscale.common.errors import DataUnavailable
from gpuscale.common.freshness import bound_of, is_stale
from gpuscale.scaler.core.profiles import SIGNALS, Target, ValueMode
from gpuscale.stream.records import PodRecord
from gpuscale.telemetry.model import Absent

MAX_NAMED = 5


class Clock(Protocol):
    """How old a record is, and the bound past which it is stale (the fleet view)."""

    @property
    def stale_after(self) -> float: ...

    def age(self, record: PodRecord) -> float: ...


class WorkloadUnavailable(DataUnavailable):
    """The workload's value cannot be given honestly now; the message says which pods and
    why."""


@dataclass(frozen=True, slots=True)
class Evaluation:
    value: float
    pods: int  # pods counted
    starting: int  # pods left out because they are not Ready and have no data yet
    ready: int = 0  # counted pods that are Ready (Value mode's divisor)


def evaluate(fleet: Clock, pods: Sequence[PodRecord], target: Target,
             mode: ValueMode, missing: Sequence[str] = ()) -> Evaluation:
    """``missing``: gaps a roster found (pods or agents that have not reported); any
    makes the answer UNAVAILABLE, named after the pods' own problems."""
    problems: list[str] = []
    total = 0.0
    counted = starting = ready = 0
    signal = SIGNALS[target.signal]
    for p in pods:
        value = p.signals.get(target.signal)
        if value is None or isinstance(value, Absent):
            if not p.ready:  # starting: no data yet, no load yet
                starting += 1
                continue
            engine = signal.engine
            if isinstance(value, Absent):
                why = value.value
                reason = p.reasons.get(target.signal)
                if reason:
                    why = f"{why}: {reason}"
            elif engine:
                why = f"no {engine} metrics (annotate the pod gpuscale.io/engine={engine})"
            else:
                why = "no reading"
            problems.append(f"{p.namespace}/{p.name} ({why})")
            continue
        age = fleet.age(p)
        bound = bound_of(p.stale_after, fleet.stale_after)  # its agent's own, or the default
        if is_stale(age, bound):
            problems.append(f"{p.namespace}/{p.name} (stale: {age:.1f}s old, bound "
                            f"{bound:.1f}s)")
            continue
        if not math.isfinite(value) or not 0.0 <= value <= signal.limit:
            problems.append(f"{p.namespace}/{p.name} (implausible {target.signal} "
                            f"{value:.6g}: outside 0..{signal.limit:g} {signal.unit})")
            continue
        total += float(value)
        counted += 1
        ready += p.ready
    parts = []
    if problems:
        parts.append(f"{len(problems)} of {len(pods)} pods have no usable {target.signal}: "
                     f"{_named(problems)}")
    if missing:
        parts.append(f"not every pod of the workload has reported: {_named(missing)}")
    if parts:
        raise WorkloadUnavailable("; ".join(parts))
    if mode is ValueMode.AVERAGE:
        return Evaluation(total / max(ready, 1), counted, starting, ready)
    return Evaluation(total, counted, starting, ready)


def _named(problems: Sequence[str]) -> str:
    more = f" and {len(problems) - MAX_NAMED} more" if len(problems) > MAX_NAMED else ""
    return ", ".join(problems[:MAX_NAMED]) + more
