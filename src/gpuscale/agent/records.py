"""One tick's attribution -> the per-pod records the agent publishes (pure).

gpu-utilization is the mean over the pod's devices (containers together), 0-100;
gpu-memory is used over total of those devices, in %; gpu-memory-used is the memory used
on them in MiB (what dcgm-exporter's DCGM_FI_DEV_FB_USED counts). An Absent device
reading makes the pod's signal that Absent, never a partial mean.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuscale.attribution.model import NodeAttribution, PodUsage
from gpuscale.stream.records import DeviceRecord, PodRecord
from gpuscale.telemetry.model import Absent, IntReading, NodeSnapshot, Reading, SharingMode


@dataclass(frozen=True, slots=True)
class EngineSignals:
    """One pod's engine signals and, for the Absent ones, why (for the scaler's reason)."""

    signals: Mapping[str, Reading]
    reasons: Mapping[str, str] = field(default_factory=dict)


def pod_records(snapshot: NodeSnapshot, attribution: NodeAttribution,
                sampled_at: float,
                engines: Mapping[tuple[str, str], EngineSignals] | None = None,
                ) -> list[PodRecord]:
    """One record per pod that holds GPUs: its GPU signals (and engine signals, if any)."""
    by_pod: dict[tuple[str, str], list[PodUsage]] = {}
    for u in attribution.pods:
        by_pod.setdefault((u.namespace, u.pod), []).append(u)
    out = []
    for (ns, name), usages in by_pod.items():
        devices = [d for u in usages for d in u.devices]
        utils = [d.utilization_percent for d in devices]
        used = [d.memory_used_bytes for d in devices]
        total = [d.memory_total_bytes for d in devices]
        signals: dict[str, Reading] = {
            "gpu-utilization": _mean(utils) if devices else Absent.NO_DATA,
            "gpu-memory": _ratio(used, total) if devices else Absent.NO_DATA,
            "gpu-memory-used": _mib(used) if devices else Absent.NO_DATA,
        }
        reasons: Mapping[str, str] = {}
        if engines and (ns, name) in engines:
            signals.update(engines[(ns, name)].signals)
            reasons = engines[(ns, name)].reasons
        info = usages[0].pod_info
        out.append(PodRecord(ns, name, snapshot.node,
                             dict(info.labels) if info else {},
                             info.owner if info else None,
                             info.ready if info else False, signals, sampled_at,
                             reasons=reasons))
    return out


def node_devices(snapshot: NodeSnapshot, attribution: NodeAttribution) -> list[DeviceRecord]:
    """The node's GPUs and MIG instances with the pods allocated each (a time-sliced GPU
    lists every pod holding one of its replicas). A GPU split into MIG instances is listed
    too (sharing "mig", no pods): its instances carry the allocations."""
    holders: dict[str, set[str]] = {}
    for u in attribution.pods:
        for d in u.devices:
            holders.setdefault(d.mig_uuid or d.gpu_uuid, set()).add(f"{u.namespace}/{u.pod}")
    out = []
    for g in snapshot.gpus:
        sharing = "mig" if g.mig_enabled else _SHARING[g.sharing]
        out.append(DeviceRecord(g.uuid, g.index, g.name, "", sharing, g.utilization_percent,
                                _to_mib(g.memory_used_bytes), _to_mib(g.memory_total_bytes),
                                tuple(sorted(holders.get(g.uuid, ())))))
        out.extend(DeviceRecord(m.uuid, g.index, m.profile, g.uuid, "exclusive",
                                m.utilization_percent, _to_mib(m.memory_used_bytes),
                                _to_mib(m.memory_total_bytes),
                                tuple(sorted(holders.get(m.uuid, ()))))
                   for m in g.migs)
    return out


_SHARING = {SharingMode.EXCLUSIVE: "exclusive", SharingMode.TIME_SLICED: "time-sliced",
            SharingMode.MPS: "mps", SharingMode.MIG: "mig"}


def _to_mib(value: IntReading) -> Reading:
    return value if isinstance(value, Absent) else value / 2**20


def _first_absent(values: list[Reading] | list[int | Absent]) -> Absent | None:
    return next((v for v in values if isinstance(v, Absent)), None)


def _mean(values: list[Reading]) -> Reading:
    bad = _first_absent(values)
    if bad is not None:
        return bad
    nums = [float(v) for v in values if not isinstance(v, Absent)]
    return sum(nums) / len(nums)


def _mib(used: list[int | Absent]) -> Reading:
    bad = _first_absent(used)
    if bad is not None:
        return bad
    return sum(v for v in used if not isinstance(v, Absent)) / 2**20


def _ratio(used: list[int | Absent], total: list[int | Absent]) -> Reading:
    bad = _first_absent(used) or _first_absent(total)
    if bad is not None:
        return bad
    t = sum(v for v in total if not isinstance(v, Absent))
    u = sum(v for v in used if not isinstance(v, Absent))
    return 100.0 * u / t if t > 0 else Absent.UNAVAILABLE
