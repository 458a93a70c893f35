"""The number KEDA gets: a workload's pods' signal, aggregated the way the HPA needs it.

With KEDA's default AverageValue target T, the HPA computes desired = ceil(value / T), so
``value`` must be the SUM over the workload's pods of the per-pod signal: then desired is
the number of pods that would each run at the target. (An average or a maximum would give
ceil(u / T) <= 2 for any target above half the signal's range: a loaded fleet could never
scale out.) With ``metricType: Value`` the HPA computes desired = ceil(ready x value / T),
so the value must be the AVERAGE: ``valueMode: average``.

Missing data never shrinks the sum. A Ready pod whose signal is absent, unsupported or
older than the staleness bound makes the answer UNAVAILABLE, naming the pods and why, so
KEDA applies its fallback. Pods that are not Ready yet and have no data are left out: they
are starting and carry no load (once they report, they count).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuscale.common.errors import DataUnavailable
from gpuscale.scaler.fleet import FleetView
from gpuscale.scaler.profiles import SIGNALS, Target, ValueMode
from gpuscale.stream.records import PodRecord
from gpuscale.telemetry.model import Absent

MAX_NAMED = 5


class WorkloadUnavailable(DataUnavailable):
    """The workload's value cannot be given honestly now; the message says which pods and
    why."""


@dataclass(frozen=True, slots=True)
class Evaluation:
    value: float
    pods: int  # pods counted
    starting: int  # pods left out because they are not Ready and have no data yet


def evaluate(fleet: FleetView, pods: list[PodRecord], target: Target,
             mode: ValueMode) -> Evaluation:
    problems: list[str] = []
    total = 0.0
    counted = starting = 0
    for p in pods:
        value = p.signals.get(target.signal)
        if value is None or isinstance(value, Absent):
            if not p.ready:  # starting: no data yet, no load yet
                starting += 1
                continue
            engine = SIGNALS[target.signal].engine
            if isinstance(value, Absent):
                why = value.value
            elif engine:
                why = f"no {engine} metrics (annotate the pod gpuscale.io/engine={engine})"
            else:
                why = "no reading"
            problems.append(f"{p.namespace}/{p.name} ({why})")
            continue
        age = fleet.age(p)
        bound = p.stale_after or fleet.stale_after
        if age > bound:
            problems.append(f"{p.namespace}/{p.name} (stale: {age:.1f}s old, bound "
                            f"{bound:.1f}s)")
            continue
        total += float(value)
        counted += 1
    if problems:
        named = ", ".join(problems[:MAX_NAMED])
        more = f" and {len(problems) - MAX_NAMED} more" if len(problems) > MAX_NAMED else ""
        raise WorkloadUnavailable(f"{len(problems)} of {len(pods)} pods have no usable "
                                  f"{target.signal}: {named}{more}")
    if mode is ValueMode.AVERAGE:
        return Evaluation(total / counted if counted else 0.0, counted, starting)
    return Evaluation(total, counted, starting)
