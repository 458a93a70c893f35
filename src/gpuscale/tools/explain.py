"""``gpuscale explain``: one ScaledObject's answer, why, and what KEDA and the HPA do with
it (pure: from the scaler's ExplainReply to a decision and its text).

The decision uses the scaler's IsActive answer (its one activity rule, sent in the reply)
and the project's own models (models.hpa, and models.keda's ``Keda`` for KEDA's part):
per metric the HPA's proposal (tolerance included), the scale-down stabilization window
fed with the scaler's recorded moments (each past proposal computed against that moment's
pod count: the HPA's own replica counts then are not known to the scaler), clamped to the
ScaledObject's bounds, through the HPA's own limits when the ScaledObject sets no behavior
(KEDA then passes none); KEDA's activation, scale to zero after cooldownPeriod, and fallback
(models.keda's count and value) when the scaler answers UNAVAILABLE. Rate limits assume no
scaling in the policies' periods (the scaler does not see the HPA's past scale events).
A workload a plain HPA reads through the metrics API (``reply.source`` "metrics-api") is
tools.explain_hpa's: the HPA alone, no KEDA.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from google.protobuf.json_format import MessageToDict

from gpuscale.common.freshness import is_stale
from gpuscale.metrics_api.served_metrics import object_metric_name
from gpuscale.models.hpa import Hpa, Metric, MetricSource, TargetType, parse_behavior
from gpuscale.models.keda import (
    FALLBACK_BEHAVIORS,
    HPA_SYNC_S,
    Keda,
    ScaledObjectSpec,
    fallback_count,
)
from gpuscale.proto import inspect_pb2 as pb
from gpuscale.scaler.core.planner import CUT_SHARE
from gpuscale.tools import explain_hpa
from gpuscale.tools.explain_decision import Decision

KEDA_DEFAULTS = ("KEDA's defaults, assumed: this scaler does not watch ScaledObjects (no API "
                 "access), so it was not told this one's; pass --min-replicas and "
                 "--max-replicas as its spec sets them")


def decide(reply: pb.ExplainReply, replicas: int | None = None,
           bounds: tuple[int | None, int | None] = (None, None)) -> Decision:
    """What KEDA and the HPA do with the answer in ``reply`` given ``replicas`` now (None:
    the target's spec.replicas from the scaler's watch, else the pods it sees), within
    ``bounds`` (min and max replicas, as given on the command line; None: the
    ScaledObject's, from the scaler's watch, else KEDA's defaults, said to be assumed).

    Whether the workload is active is the scaler's answer (``reply.activity``: IsActive's,
    by its one rule), never decided here. What KEDA makes of the answers is models.keda's
    ``Keda``, once the moment has lasted (``Keda.settled``): a metric KEDA cannot read -
    every metric, while IsActive fails (KEDA reads each metric with IsActive) - is, to the
    HPA, a metric it cannot read (it then scales up on the others but never down), or,
    once KEDA's fallback applies, the value that makes the fallback's count desired, which
    the HPA takes like any other; at zero replicas KEDA's RequestScale decides (a fallback
    that applies counts as active)."""
    st = reply.scale_target
    if replicas is not None:
        current, source = replicas, "given with --replicas"
    elif st.replicas >= 0 and (st.known or reply.source == explain_hpa.METRICS_API):
        current, source = st.replicas, f"{st.kind} {st.name}'s spec.replicas"
    else:
        current, source = reply.pod_count, ("pods of the selection the agents report "
                                            "(pass --replicas for the HPA's count)")
    if reply.source == explain_hpa.METRICS_API:  # a plain HPA: no ScaledObject, no KEDA
        d = Decision(current, source, current, None)
        explain_hpa.decide_hpa(reply, d, bounds)
        return d
    spec = scaled_object_spec(st)
    given_lo, given_hi = bounds
    spec = replace(spec, min_replicas=spec.min_replicas if given_lo is None else given_lo,
                   max_replicas=spec.max_replicas if given_hi is None else given_hi)
    lo, hi = spec.min_replicas, spec.max_replicas
    d = Decision(current, source, current, _ACTIVITY.get(reply.activity))
    limits = f"min {lo}, max {hi} ({_bounds_from(st.known, bounds)})"
    value_mode = reply.value_mode == "average"
    target_type = TargetType.VALUE if value_mode else TargetType.AVERAGE_VALUE
    readable = [a for a in reply.answers if not a.unavailable]
    ready = max([a.ready for a in readable] + [0]) or current
    _activity_line(d, reply, readable)
    failing = [i for i, a in enumerate(reply.answers) if a.unavailable or d.active is None]
    fallback = _fallback_lines(d, st, [reply.answers[i] for i in failing], value_mode,
                               current)
    keda = Keda(spec)
    seen = keda.settled(current, ready, [
        Metric(MetricSource.EXTERNAL, target_type, a.target,
               None if a.unavailable else a.value) for a in reply.answers], d.active)
    at = reply.at or reply.now
    if current == 0:
        _at_zero(d, keda.poll(at, 0, d.active, seen=seen))
        return d
    hpa = Hpa(max(1, lo), hi, *parse_behavior(st.behavior_json), fresh=False)  # running
    _replay(hpa, reply.past, target_type)  # since before ``past``
    for i, (a, m) in enumerate(zip(reply.answers, seen.metrics, strict=True)):
        if i in failing:
            if m.value is not None:
                per = f" / {ready} ready pods" if value_mode else ""
                d.lines.append(f"{a.metric_name}: fallback value {m.value:g} ({fallback}{per} "
                               f"x {a.target:g}) -> {hpa.proposal(m, current, ready)}")
            continue
        proposal = hpa.proposal(m, current, ready)
        if value_mode:
            formula = f"ratio {a.value:.6g}/{a.target:g} x {ready} ready pods"
        else:
            formula = f"ceil({a.value:.6g} / {a.target:g})"
        ratio = a.value / (a.target * (1 if value_mode else max(current, 1)))
        within = hpa.within(ratio)
        d.lines.append(f"{a.metric_name}: {formula} -> {proposal}"
                       f"{' (within tolerance: keep ' + str(current) + ')' if within else ''}")
    desired = hpa.step(at, current, list(seen.metrics), ready)
    d.desired = desired
    d.lines.append(f"HPA: {hpa.last_reason}; clamped to {limits} -> {desired}"
                   f"{'' if desired != current else ' (no change)'}")
    window = hpa.down_window_s
    if not hpa.has_behavior:
        d.lines.append("no HPA behavior in the ScaledObject: KEDA passes none, so the HPA "
                       "scales up at most to max(2 x current, 4) per sync and holds "
                       "scale-downs for its 300s window")
    if reply.past:
        d.lines.append(f"scale-down stabilization: {window:g}s window over "
                       f"{len(reply.past)} recorded moments")
    elif desired < current and window > 0:
        d.lines.append(f"no recorded moments to replay: the HPA holds the highest "
                       f"recommendation of its last {window:g}s, which may keep more than "
                       f"{desired}")
    if d.active is False and not seen.error and lo == 0:
        d.lines.append(f"inactive with minReplicaCount 0: KEDA scales to 0 after "
                       f"cooldownPeriod ({st.cooldown_period}s) without activity")
    return d


_ACTIVITY = {"active": True, "inactive": False}  # else (unavailable, not said): None


def _bounds_from(known: bool, given: tuple[int | None, int | None]) -> str:
    """Where the replica bounds came from, in words."""
    if None not in given:
        return "given with --min-replicas and --max-replicas"
    if known:
        return "the ScaledObject's" + ("" if given == (None, None) else ", one given")
    if given == (None, None):
        return KEDA_DEFAULTS
    return ("one given, KEDA's default for the other: this scaler does not know the "
            "ScaledObject's; pass both")


def scaled_object_spec(st: pb.ScaleTarget) -> ScaledObjectSpec:
    """The ScaledObject as the scaler reports it (KEDA's defaults where it does not know
    it), for models.keda."""
    return ScaledObjectSpec(
        polling_s=float(st.polling_interval), cooldown_s=float(st.cooldown_period),
        min_replicas=st.min_replicas, max_replicas=st.max_replicas,
        fallback_replicas=None if st.fallback_replicas < 0 else st.fallback_replicas,
        failure_threshold=st.fallback_failures,
        fallback_behavior=st.fallback_behavior or "static",
        target_kind=st.kind or "Deployment", target_name=st.name,
        behavior_json=st.behavior_json)


def _activity_line(d: Decision, reply: pb.ExplainReply, readable: list[pb.Answer]) -> None:
    """The scaler's IsActive answer, with the values and thresholds it was made from."""
    words = ", ".join(f"{a.value:.6g} (activation {a.activation:g})" for a in readable)
    if reply.demand_source:
        words += f"; demand source {reply.demand_source}: {reply.demand or 'unknown'}"
    if d.active is None:
        why = reply.activity_reason or ("this scaler does not say (older than this "
                                        "explain)" if not reply.activity else "")
        state = f"activity unknown (IsActive: UNAVAILABLE{': ' + why if why else ''})"
    else:
        state = "active" if d.active else "inactive"
    d.lines.append(f"{state}: {words.lstrip('; ') or 'no readable metric'}")


def _replay(hpa: Hpa, past: Iterable[pb.Past], target_type: TargetType) -> None:
    """Feed the HPA's scale-down window with the recorded moments' proposals (each
    against that moment's pod count: the HPA's own counts then are not known here)."""
    for moment in past:
        if any(a.unavailable for a in moment.answers) or moment.pods <= 0:
            continue
        props = [hpa.proposal(Metric(MetricSource.EXTERNAL, target_type, a.target, a.value),
                              moment.pods, max(a.ready for a in moment.answers) or moment.pods)
                 for a in moment.answers]
        valid = [p for p in props if p is not None]
        if valid:
            hpa.remember(moment.at, max(valid))


def _at_zero(d: Decision, set_to: int | None) -> None:
    """KEDA at zero replicas: what its RequestScale set (``set_to``; None: nothing)."""
    if set_to:
        d.desired = set_to
        d.lines.append(f"KEDA activates the workload: 0 -> {set_to} (then the HPA takes "
                       f"over){'' if d.active else '; the fallback counts as active'}")
    elif d.active is None:
        d.lines.append("stays at 0: KEDA cannot tell whether it is active, and does not "
                       "activate on errors")
    else:
        d.lines.append("stays at 0: nothing is active")


def _fallback_lines(d: Decision, st: pb.ScaleTarget, failing: list[pb.Answer],
                    value_mode: bool, current: int) -> int | None:
    """Say what KEDA does about the metrics it cannot read; the fallback's replica count
    when it applies (None: the HPA cannot read those metrics)."""
    if not failing:
        return None
    for a in failing:
        why = a.unavailable or "IsActive is UNAVAILABLE, and KEDA reads it with each metric"
        d.lines.append(f"{a.metric_name}: UNAVAILABLE to KEDA: {why}")
    if st.fallback_replicas < 0:
        if st.known:
            d.lines.append("no fallback configured: the HPA cannot read it, so it does not "
                           "scale down (it still scales up on the other metrics); set "
                           "spec.fallback to hold a safe count")
        else:
            d.lines.append("fallback: unknown here (the scaler does not watch "
                           "ScaledObjects); without one the HPA does not scale down on a "
                           "metric it cannot read")
        return None
    behavior = st.fallback_behavior or "static"
    if behavior not in FALLBACK_BEHAVIORS:
        d.lines.append(f"fallback behavior {behavior!r} is not one this model knows "
                       f"({', '.join(FALLBACK_BEHAVIORS)}): taken as static")
    count = fallback_count(behavior, st.fallback_replicas, current)
    per = " divided among the Ready pods (Value: KEDA 2.18+)" if value_mode else ""
    d.lines.append(f"KEDA counts a failure at each poll (every {st.polling_interval}s) and at "
                   f"each HPA read (every {HPA_SYNC_S:g}s); after more than "
                   f"{st.fallback_failures} in a row it answers for {count} replicas{per} "
                   f"({behavior}, replicas {st.fallback_replicas}); until then the HPA does "
                   f"not scale down. Assuming the fallback applies:")
    return count


LABEL = 10  # the width of each line's label ("trigger   ", "decision  ")


def fields(label: str, items: Sequence[str], width: int, sep: str = "") -> list[str]:
    """``label`` and ``items`` (each ending in ``sep`` but the last) on lines of at most
    ``width`` columns, wrapped between items and never inside one: an item wider than a
    line has a line of its own. Continuation lines are indented under the first item."""
    out = [f"{label:<{LABEL}}"]
    for i, item in enumerate(items):
        piece = item + (sep if i < len(items) - 1 else "")
        line = out[-1]
        if len(line) > LABEL and len(line) + 1 + len(piece) > width:
            out.append(" " * LABEL + piece)
        else:
            out[-1] = line + ("" if len(line) == LABEL else " ") + piece
    return out


def render(reply: pb.ExplainReply, decision: Decision, width: int = 100) -> str:
    """One screen of text. Nothing is ever cut (a pipe's reader greps for it): the
    trigger's metadata and the planner's terms wrap between values at ``width`` columns,
    a sentence has a line of its own, and the pod table is as wide as its widest cells."""
    when = reply.at or reply.now
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(when))
    hpa = reply.source == explain_hpa.METRICS_API
    moment = f"{stamp}{' (recorded)' if reply.at else ' (now)'}"
    out = ([explain_hpa.header(reply), f"at        {moment}; the HPA last read it "
                                       f"{_ago(reply.seen)}"] if hpa else
           [f"ScaledObject {reply.namespace}/{reply.name} at {moment}; KEDA last asked "
            f"{_ago(reply.seen)}"])
    out += (fields("metric", explain_hpa.settings(reply), width, sep=",") if hpa else
            fields("trigger", [f"{k}={v}" for k, v in sorted(reply.metadata.items())]
                   or ["-"], width))
    out.append(f"selects   {reply.selector or '-'} ({reply.value_mode} over pods); "
               f"{reply.pod_count} pods in the fleet view")
    if reply.pods:
        out += _pod_table(reply)
    out += [f"missing   {m}" for m in reply.missing]
    for a in reply.answers:
        if a.unavailable:
            out.append(f"answer    {a.metric_name}: UNAVAILABLE ({a.unavailable})")
        elif hpa:
            out.append(f"answer    {object_metric_name(a.signal)}: {a.value:.6g} "
                       f"({a.counted} pods counted, {a.starting} starting)")
        else:
            out.append(f"answer    {a.metric_name}: {a.value:.6g} (signal {a.signal}, target "
                       f"{a.target:g}, activation {a.activation:g}; {a.counted} pods counted"
                       f", {a.starting} starting)")
    if reply.planned_replicas >= 0:
        terms = [f"{k} {v:.3g}" for k, v in sorted(reply.plan_terms.items())]
        items = [f"{reply.planned_replicas} replicas" + (f" ({terms[0]}" if terms else ""),
                 *terms[1:]]
        items[-1] += ")" if terms else ""
        out += fields("planner", items, width, sep=",")
        out.append(f"why       {plan_reason(reply.planned_replicas, reply.plan_terms)}")
    out.append(f"replicas  now {decision.current} ({decision.current_from})")
    out.extend(f"decision  {line}" for line in decision.lines)
    verdict = (f"-> {decision.desired} replicas" if decision.desired != decision.current
               else f"-> stays at {decision.current}")
    out.append(f"result    {verdict}")
    return "\n".join(out)


SHOWN_PODS = 40  # the pod table's rows (--json lists every pod)


def _pod_table(reply: pb.ExplainReply) -> list[str]:
    """The selection's pods, each column as wide as its widest value (none is cut)."""
    signals = [a.signal for a in reply.answers]
    rows = []
    for p in reply.pods[:SHOWN_PODS]:
        value = "-"
        if signals and signals[0] in p.signals:
            r = p.signals[signals[0]]
            value = (f"({r.absent})" if r.absent else f"{r.value:.4g}")
        stale = " stale" if is_stale(p.age, p.stale_after) else ""
        rows.append((p.name, p.node, ", ".join(p.gpus) or "-", "yes" if p.ready else "no",
                     value, f"{p.age:5.1f}s{stale}"))
    head = ("POD", "NODE", "GPUS", "READY", "VALUE", "AGE")
    w = [max([len(head[i]), 5] + [len(r[i]) for r in rows]) for i in range(len(head))]
    w[0], w[1], w[2] = max(w[0], 28), max(w[1], 16), max(w[2], 22)  # as it always was

    def line(cells: Sequence[str]) -> str:
        return (f"  {cells[0]:<{w[0]}} {cells[1]:<{w[1]}} {cells[2]:<{w[2]}} "
                f"{cells[3]:<{w[3]}} {cells[4]:>{w[4]}} {cells[5]:>6}").rstrip()

    out = [line(head)] + [line(r) for r in rows]
    if len(reply.pods) > SHOWN_PODS:
        out.append(f"  ... and {len(reply.pods) - SHOWN_PODS} more (--json lists all)")
    return out


_TERMS = {"steady": "the last minute's work (with the decode of sequences that joined) "
                     "with the utilization target's room and its growth over a start-up, "
                     "over the capacity a pod delivers",
          "burst": "the delay bound of the bursts remembered",
          "concurrency": "running sequences over the batch",
          "kv": "the KV cache's use, with its fill over a start-up"}


def plan_reason(planned: int, terms: Mapping[str, float]) -> str:
    """Which of the planner's terms (scaler.core.planner, as the scaler exports them)
    sets its count, in a sentence (and the spares on top, scaler.core.hedge)."""
    extra = int(terms.get("spare", 0.0))
    if extra > 0:
        return (f"{_reason(planned - extra, terms)}; + {extra} spare while the scale-up "
                "starts (spareReplicas: the first pods Ready serve, the rest are removed)")
    return _reason(planned, terms)


def _reason(planned: int, terms: Mapping[str, float]) -> str:
    floor = int(terms.get("drain_floor", 0.0))
    if floor and floor >= planned:
        run = terms.get("request_s", math.nan)
        if math.isnan(run):
            return (f"kept at the {floor} Ready pods: requests are running and the planner "
                    "has not seen a minute of them yet (a scale-down could cut them)")
        return (f"kept at the {floor} Ready pods: a scale-down would cut more than "
                f"{CUT_SHARE:.0%} of a minute's requests (they run ~{run:.0f} s, longer "
                f"than the pods' grace lets them finish; see drainSeconds)")
    unheld = int(terms.get("unheld", 0.0))
    if planned > unheld:
        return (f"held: {planned} was needed within the last start-up "
                f"({terms.get('startup', math.nan):.0f} s; the load alone needs {unheld}), "
                "or the planner has not seen a whole hold window yet and keeps the pods "
                "that exist")
    name = max(_TERMS, key=lambda k: terms.get(k, 0.0))
    backlog = terms.get("backlog", 0.0)
    queue = f" + backlog {backlog:.3g} (the queue spread over a start-up)" if backlog else ""
    return f"ceil({name} {terms.get(name, 0.0):.3g}{queue}): {_TERMS[name]}"


def as_json(reply: pb.ExplainReply, decision: Decision) -> dict[str, Any]:
    doc = MessageToDict(reply, preserving_proto_field_name=True,
                        always_print_fields_with_no_presence=True)
    doc["decision"] = {"current": decision.current, "current_from": decision.current_from,
                       "desired": decision.desired, "active": decision.active,
                       "reasons": decision.lines}
    return doc


def _ago(seconds: float) -> str:
    return f"{seconds:.0f}s ago" if seconds < 120 else f"{seconds / 60:.0f} min ago"
