"""``gpuscale explain`` for a workload a plain HPA reads through custom.metrics.k8s.io (the
scaler's metrics API, Object metrics of a Deployment or StatefulSet): the HPA's arithmetic
alone (models.hpa). No KEDA is involved, so no activation, cooldown or fallback: a metric
the scaler answers 503 for is one the HPA cannot read (it then scales up on the others but
never down).

What the scaler does not see is assumed and said: the HPA's spec (its bounds, its targets,
its behavior). ``gpuscale_planned_replicas`` has the target ``averageValue: "1"`` and the
scale-down without a window that docs/hpa.md and ``gpuscale generate --hpa`` give it;
another metric's target is the HPA's own, so its proposal is not computed.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from gpuscale.metrics_api.served_metrics import object_metric_name
from gpuscale.models.hpa import SCALE_DOWN, SCALE_UP, Hpa, Metric, MetricSource, TargetType
from gpuscale.scaler.core.profiles import PLANNED

if TYPE_CHECKING:
    from gpuscale.proto import inspect_pb2 as pb
    from gpuscale.tools.explain_decision import Decision

METRICS_API = "metrics-api"  # ExplainReply.source of a workload an HPA reads
UNBOUNDED = 2**31 - 1  # an HPA's maxReplicas when not given (an int32)
NOT_WATCHED = ("the HPA's, not known to this scaler (it does not watch HPAs); pass "
               "--min-replicas and --max-replicas as its spec sets them")


def header(reply: pb.ExplainReply) -> str:
    """The first words of explain's text: the workload and who reads it."""
    kind, _, name = reply.name.partition("/")
    return (f"{kind} {reply.namespace}/{name} (read by an HPA through "
            "custom.metrics.k8s.io)")


def settings(reply: pb.ExplainReply) -> list[str]:
    """The metric the HPA reads and its selector (the planner's settings)."""
    names = [object_metric_name(a.signal) for a in reply.answers]
    pairs = [f"{k}={v}" for k, v in sorted(reply.metadata.items())
             if k not in ("profile", "signal", "targetValue")]
    return [*names, f"selector {','.join(pairs)}"] if pairs else names


def decide_hpa(reply: pb.ExplainReply, d: Decision,
               bounds: tuple[int | None, int | None]) -> None:
    """What the HPA does with the scaler's answers at ``d.current`` replicas, within
    ``bounds`` (as given; None: not known, said): ``d``'s lines and desired count."""
    given_lo, given_hi = bounds
    lo = 1 if given_lo is None else given_lo  # the API server's default minReplicas
    hi = UNBOUNDED if given_hi is None else given_hi
    planned = any(a.signal == PLANNED for a in reply.answers)
    hpa = Hpa(lo, hi, SCALE_UP, replace(SCALE_DOWN, stabilization_s=0.0) if planned
              else SCALE_DOWN, fresh=False)
    ready = max([a.ready for a in reply.answers if not a.unavailable] + [0]) or d.current
    metrics = []
    for a in reply.answers:
        name = object_metric_name(a.signal)
        if a.unavailable:
            d.lines.append(f"{name}: 503 to the HPA ({a.unavailable}): it cannot read it, "
                           "so it does not scale down")
            metrics.append(Metric(MetricSource.OBJECT, TargetType.AVERAGE_VALUE, 1.0, None))
        elif a.signal == PLANNED:
            m = Metric(MetricSource.OBJECT, TargetType.AVERAGE_VALUE, 1.0, a.value)
            metrics.append(m)
            proposal = hpa.proposal(m, d.current, ready)
            d.lines.append(f"{name}: ceil({a.value:.6g} / 1) -> {proposal} (target "
                           'averageValue "1", as docs/hpa.md sets it)')
        else:
            d.lines.append(f"{name}: {a.value:.6g}, the sum over the pods; the HPA proposes "
                           "ceil(value / its averageValue target), which is in its spec, "
                           "not known here")
    if not metrics:
        d.lines.append("HPA: no proposal computed here (its targets are not known): "
                       f"keeping {d.current} as far as this scaler can tell")
        return
    d.desired = hpa.step(reply.at or reply.now, d.current, metrics, ready)
    limit = "none" if given_hi is None else str(hi)
    where = ("given with --min-replicas and --max-replicas" if None not in bounds
             else NOT_WATCHED if bounds == (None, None)
             else "one given; the other " + NOT_WATCHED)
    d.lines.append(f"HPA: {hpa.last_reason}; clamped to min {lo}, max {limit} ({where}) "
                   f"-> {d.desired}{'' if d.desired != d.current else ' (no change)'}")
    if planned:
        d.lines.append("scale-down: no stabilization window assumed (the planner holds its "
                       "plan for a start-up itself; gpuscale generate --hpa writes 0)")
    if d.current == 0:
        d.lines.append("at 0 replicas the HPA (minReplicas 0, HPAScaleToZero) wakes on "
                       "gpuscale_demand_pending, read beside this metric")
