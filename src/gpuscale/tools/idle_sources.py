"""Where ``gpuscale idle``'s devices come from: the scaler's per-minute history (an
Inspect Usage reply) or range queries against Prometheus (dcgm-style series), each made
into the time buckets of idle.py. Pure: the reply and the matrices are fetched elsewhere
(tools/client.py, tools/promql.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuscale.proto import inspect_pb2 as pb
from gpuscale.tools.idle import AdvisoryPlan, Bucket, Device, device_share


def devices_from_usage(reply: pb.UsageReply) -> list[Device]:
    """The scaler's per-minute history as devices (utilization -1 or no samples: no
    reading)."""
    out = []
    for d in reply.devices:
        fraction = d.fraction if 0 < d.fraction <= 1 else 1.0
        out.append(Device(d.node, d.uuid, d.model, fraction, tuple(
            Bucket(m.start, reply.minute or 60.0, tuple(m.pods), tuple(m.owners),
                   m.utilization if m.samples > 0 and m.utilization >= 0 else None)
            for m in d.minutes)))
    return out


def advisory_from_usage(reply: pb.UsageReply) -> tuple[AdvisoryPlan, ...]:
    """The scaler's advisory plans (-1: not known)."""
    return tuple(AdvisoryPlan(a.namespace, a.name, a.planned if a.planned >= 0 else None,
                              a.actual if a.actual >= 0 else None, a.planned_gpu_hours,
                              a.actual_gpu_hours, a.known_seconds, a.unknown_seconds, a.why)
                 for a in reply.advisory)


@dataclass(frozen=True, slots=True)
class Series:
    """One series of a Prometheus matrix: its labels and (time, value) points."""

    labels: Mapping[str, str]
    points: tuple[tuple[float, float], ...]


def holder(labels: Mapping[str, str]) -> str:
    """"namespace/pod" of the pod a device series is attributed to ("" none). A scrape
    that kept its own target labels renamed ours to exported_*: those win."""
    pod = labels.get("exported_pod") or labels.get("pod") or ""
    ns = labels.get("exported_namespace") or labels.get("namespace") or ""
    return f"{ns}/{pod}" if pod and ns else ""


def device_key(labels: Mapping[str, str]) -> tuple[str, str]:
    """(node, device) of a dcgm-style series: a MIG instance is its GPU's UUID and
    GPU_I_ID (its own UUID is not a label)."""
    gi = labels.get("GPU_I_ID", "")
    uuid = labels.get("UUID", "")
    return labels.get("Hostname", ""), f"{uuid}/{gi}" if gi else uuid


def devices_from_matrices(held: Sequence[Series], utilization: Sequence[Series],
                          memory: Sequence[Series], step: float,
                          owners: Mapping[str, str]) -> list[Device]:
    """Devices from range queries evaluated at the end of each ``step``-second bucket:
    ``held`` (any per-device series; a point with a holder's labels means that pod held the
    device in that bucket), ``utilization`` (percent, per device and holder), ``memory``
    (the MIG instances' and GPUs' memory totals, for a MIG instance's fraction); ``owners``
    maps "namespace/pod" to its workload "Kind/name"."""
    pods: dict[tuple[str, str], dict[float, set[str]]] = {}
    utils: dict[tuple[str, str], dict[float, list[float]]] = {}
    models: dict[tuple[str, str], str] = {}
    for s in (*held, *utilization):
        key = device_key(s.labels)
        if not key[1]:
            continue
        profile = s.labels.get("GPU_I_PROFILE", "")
        models.setdefault(key, f"{s.labels.get('modelName', '')} {profile}".strip())
        who = holder(s.labels)
        times = pods.setdefault(key, {})
        for t, _ in s.points:
            times.setdefault(t, set())
            if who:
                times[t].add(who)
    for s in utilization:
        key = device_key(s.labels)
        for t, v in s.points:
            if math.isfinite(v):
                utils.setdefault(key, {}).setdefault(t, []).append(v)
    fractions = _mig_fractions(memory)
    out = []
    for key, times in sorted(pods.items()):
        fraction = fractions.get(key) or _profile_fraction(models[key], key)
        buckets = []
        for t in sorted(times):
            held_by = tuple(sorted(times[t]))
            values = utils.get(key, {}).get(t)
            buckets.append(Bucket(t - step, step, held_by,
                                  tuple(owners.get(p, "") for p in held_by),
                                  sum(values) / len(values) if values else None))
        out.append(Device(key[0], key[1], models[key], fraction, tuple(buckets)))
    return out


def _mig_fractions(memory: Sequence[Series]) -> dict[tuple[str, str], float]:
    """(node, "<UUID>/<GI>") -> the instance's memory over its GPU's."""
    whole: dict[tuple[str, str], float] = {}
    parts: dict[tuple[str, str], float] = {}
    for s in memory:
        if not s.points:
            continue
        value = s.points[-1][1]
        key = device_key(s.labels)
        (parts if "/" in key[1] else whole)[key] = value
    out = {}
    for (node, dev), mine in parts.items():
        gpu = whole.get((node, dev.split("/")[0]))
        if gpu and math.isfinite(mine) and math.isfinite(gpu) and gpu > 0 and mine > 0:
            out[(node, dev)] = min(1.0, mine / gpu)
    return out


def _profile_fraction(model: str, key: tuple[str, str]) -> float:
    """A MIG instance or AMD partition without memory totals: its share by its profile
    (compute slices of 7; one of its mode's partitions); a GPU: 1."""
    share = device_share(model)
    if "/" not in key[1] or share is None:
        return 1.0
    return share[1]
