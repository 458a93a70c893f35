"""One agent tick -> the node's report (pure): ``tick`` turns the snapshot, its attribution
and the engines' latest readings into one ``NodeReport`` that the telemetry stream and any
sink in the same process take.

The report is complete, or says why its pods are not yet known: the GPU backend or
attribution unavailable, or a pod holding GPUs whose metadata (labels, readiness, owner) is
not known yet - before the pod cache has synced, or a pod the watch has not delivered.
Published without labels, such a pod would match no workload and drop out of its sum.

Per pod: gpu-utilization is the mean over the pod's devices (containers together), 0-100;
gpu-memory is used over total of those devices, in %; gpu-memory-used is the memory used on
them in MiB (what dcgm-exporter's DCGM_FI_DEV_FB_USED counts). An Absent device reading makes
the pod's signal that Absent, never a partial mean. Engine signals join the pod's record.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from gpuscale.attribution.model import (
    AttributionState,
    DeviceUsage,
    NodeAttribution,
    PodUsage,
)
from gpuscale.common.errors import Unavailable
from gpuscale.common.freshness import is_stale, staleness_bound
from gpuscale.stream.records import DeviceRecord, NodeReport, PodRecord
from gpuscale.telemetry.model import (
    Absent,
    BackendState,
    IntReading,
    NodeSnapshot,
    Reading,
    SharingMode,
)

PodKey = tuple[str, str]  # (namespace, name)


class EngineReading(Protocol):
    """One pod's latest engine scrape (engines.scrape.EngineReading; that module does I/O,
    so its shape is named here)."""

    @property
    def signals(self) -> Mapping[str, Reading]: ...

    @property
    def scraped_at(self) -> float:
        """Monotonic time the scrape ended."""
        ...

    @property
    def error(self) -> str:
        """Why the UNAVAILABLE signals are ("" when every signal is a number or NO_DATA)."""
        ...


@dataclass(frozen=True, slots=True)
class EngineSignals:
    """One pod's engine signals and, for the Absent ones, why (for the scaler's reason)."""

    signals: Mapping[str, Reading]
    reasons: Mapping[str, str] = field(default_factory=dict)


def tick(snapshot: NodeSnapshot, attribution: NodeAttribution | None,
         engines: Mapping[PodKey, EngineReading], now: float, *, interval: float,
         node: str = "") -> NodeReport:
    """The node's report for one tick. ``attribution``: who holds which GPU (None: none
    yet); ``engines``: the latest engine scrape of each pod; ``now``: the monotonic time,
    for the scrapes' age (stale past the staleness bound of ``interval``, the agent's tick
    in seconds); ``node``: the node's name where the snapshot has none. A complete report
    carries the pods (stamped with the snapshot's monotonic time) and the devices; an
    incomplete one neither."""
    name = snapshot.node or node
    known = trusted(snapshot, attribution)
    if isinstance(known, Unavailable):
        return NodeReport(name, snapshot.seq, snapshot.monotonic, interval, known)
    pods = pod_records(snapshot, known, sampled_at=snapshot.monotonic,
                       engines=engine_signals(engines, now, staleness_bound(interval)))
    return NodeReport(name, snapshot.seq, snapshot.monotonic, interval, tuple(pods),
                      tuple(node_devices(snapshot, known)))


def trusted(snapshot: NodeSnapshot,
            attribution: NodeAttribution | None) -> NodeAttribution | Unavailable:
    """The tick's attribution when the pods it names can be published, else why not."""
    if snapshot.state is not BackendState.OK:
        return Unavailable(f"GPU backend {snapshot.state.value}")
    if attribution is None:
        return Unavailable("no attribution yet")
    if attribution.state is AttributionState.UNAVAILABLE:
        return Unavailable("; ".join(attribution.reasons)[:200] or "attribution unavailable")
    unknown = sorted({f"{u.namespace}/{u.pod}" for u in attribution.pods
                      if u.pod_info is None})
    if unknown:
        more = f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
        return Unavailable(f"pod metadata not known yet for {', '.join(unknown[:3])}{more} "
                           f"({'; '.join(attribution.reasons)[:120]})")
    return attribution


def engine_signals(readings: Mapping[PodKey, EngineReading], now: float,
                   stale_after: float) -> dict[PodKey, EngineSignals]:
    """Per-pod engine signals, and why the unusable ones are: the scrape's reason, or
    "stale" when the last good scrape is older than ``stale_after`` seconds at ``now``."""
    out: dict[PodKey, EngineSignals] = {}
    for key, r in readings.items():
        age = now - r.scraped_at
        if is_stale(age, stale_after):
            why = f"last engine scrape {age:.1f}s ago ({r.error or 'no answer since'})"
            out[key] = EngineSignals(dict.fromkeys(r.signals, Absent.UNAVAILABLE),
                                     dict.fromkeys(r.signals, why))
            continue
        reasons = {name: r.error for name, value in r.signals.items()
                   if isinstance(value, Absent) and r.error}
        out[key] = EngineSignals(r.signals, reasons)
    return out


def pod_records(snapshot: NodeSnapshot, attribution: NodeAttribution,
                sampled_at: float,
                engines: Mapping[PodKey, EngineSignals] | None = None,
                ) -> list[PodRecord]:
    """One record per pod that holds GPUs: its GPU signals (and engine signals, if any)."""
    by_pod: dict[PodKey, list[PodUsage]] = {}
    for u in attribution.pods:
        by_pod.setdefault((u.namespace, u.pod), []).append(u)
    out = []
    for (ns, name), usages in by_pod.items():
        devices = [d for u in usages for d in u.devices]
        unmatched = [raw for u in usages for raw in u.unmatched]
        utils = [d.utilization_percent for d in devices]
        used = [d.memory_used_bytes for d in devices]
        total = [d.memory_total_bytes for d in devices]
        known = bool(devices) and not unmatched  # else a figure of some devices only
        signals: dict[str, Reading] = {
            "gpu-utilization": _mean(utils) if known else Absent.NO_DATA,
            "gpu-memory": _ratio(used, total) if known else Absent.NO_DATA,
            "gpu-memory-used": _mib(used) if known else Absent.NO_DATA,
        }
        reasons: dict[str, str] = {}
        if unmatched:
            # 300: a DRA device's raw form names its claim and then why (a claim name
            # alone is up to 253 characters); cut at 80 the why was lost
            why = (f"allocated device {unmatched[0][:300]} is not one this node's agent "
                   f"reads" + (f" (and {len(unmatched) - 1} more)" if len(unmatched) > 1
                               else ""))
            reasons = dict.fromkeys(("gpu-utilization", "gpu-memory", "gpu-memory-used"),
                                    why)
        elif known and isinstance(signals["gpu-memory"], Absent):
            said = _memory_reason(snapshot, devices)
            if said:
                reasons = dict.fromkeys(("gpu-memory", "gpu-memory-used"), said)
        if engines and (ns, name) in engines:
            signals.update(engines[(ns, name)].signals)
            reasons.update(engines[(ns, name)].reasons)
        info = usages[0].pod_info
        out.append(PodRecord(ns, name, snapshot.node,
                             dict(info.labels) if info else {},
                             info.owner if info else None,
                             info.ready if info else False, signals, sampled_at,
                             reasons=reasons))
    return out


def node_devices(snapshot: NodeSnapshot, attribution: NodeAttribution) -> list[DeviceRecord]:
    """The node's GPUs and MIG instances with the pods allocated each (a time-sliced GPU
    lists every pod holding one of its replicas) and, beside them, the DRA claim each holds
    it through ("" for a device plugin's). A GPU split into MIG instances is listed too
    (sharing "mig", no pods): its instances carry the allocations."""
    holders: dict[str, dict[str, str]] = {}  # device -> pod -> claim
    for u in attribution.pods:
        for d in u.devices:
            held = holders.setdefault(d.mig_uuid or d.gpu_uuid, {})
            pod = f"{u.namespace}/{u.pod}"
            held[pod] = held.get(pod) or d.device.claim

    def record(uuid: str, index: int, model: str, parent: str, sharing: str,
               util: Reading, used: IntReading, total: IntReading) -> DeviceRecord:
        held = holders.get(uuid, {})
        pods = tuple(sorted(held))
        claims = tuple(held[p] for p in pods) if any(held.values()) else ()
        return DeviceRecord(uuid, index, model, parent, sharing, util, _to_mib(used),
                            _to_mib(total), pods, claims)

    out = []
    for g in snapshot.gpus:
        sharing = "mig" if g.mig_enabled else _SHARING[g.sharing]
        out.append(record(g.uuid, g.index, g.name, "", sharing, g.utilization_percent,
                          g.memory_used_bytes, g.memory_total_bytes))
        out.extend(record(m.uuid, g.index, m.profile, g.uuid, "exclusive",
                          m.utilization_percent, m.memory_used_bytes, m.memory_total_bytes)
                   for m in g.migs)
    return out


_SHARING = {SharingMode.EXCLUSIVE: "exclusive", SharingMode.TIME_SLICED: "time-sliced",
            SharingMode.MPS: "mps", SharingMode.MIG: "mig"}


def _memory_reason(snapshot: NodeSnapshot, devices: list[DeviceUsage]) -> str:
    """Why the backend says a device's memory is not a number (the first of the pod's
    devices that says), or ""."""
    said: dict[str, str] = {}
    for g in snapshot.gpus:
        said[g.uuid] = g.memory_reason
        said.update((m.uuid, m.memory_reason) for m in g.migs)
    return next((said[key] for d in devices
                 if said.get(key := d.mig_uuid or d.gpu_uuid)), "")


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
