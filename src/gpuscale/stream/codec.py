"""PodRecord <-> telemetry.proto messages (pure)."""

from __future__ import annotations

from collections.abc import Iterable

from gpuscale.attribution.model import OwnerRef
from gpuscale.common.errors import PeerError
from gpuscale.proto import telemetry_pb2 as pb
from gpuscale.stream.records import PodRecord
from gpuscale.telemetry.model import Absent, Reading

MAX_PODS_PER_NODE = 2048
MAX_SIGNALS = 32
MAX_DETAIL = 200
_ABSENT = {a.value: a for a in Absent}


def encode(node: str, agent_id: str, seq: int, sampled_at: float, interval: float,
           records: Iterable[PodRecord] | str) -> pb.NodeUpdate:
    """One update: the node's pods, or, when there are none to trust this tick, why not
    (``attribution_ok=False``; the subscriber keeps what it had, which ages)."""
    complete = not isinstance(records, str)
    msg = pb.NodeUpdate(node=node, agent_id=agent_id, seq=seq, sampled_at=sampled_at,
                        interval=interval, attribution_ok=complete,
                        attribution_detail="" if complete else str(records)[:MAX_DETAIL])
    if isinstance(records, str):
        return msg
    for r in records:
        pod = msg.pods.add(namespace=r.namespace, name=r.name, ready=r.ready,
                           owner_kind=r.owner.kind if r.owner else "",
                           owner_name=r.owner.name if r.owner else "")
        pod.labels.update(r.labels)
        for name, value in r.signals.items():
            if isinstance(value, Absent):
                pod.signals[name].absent = value.value
                pod.signals[name].detail = r.reasons.get(name, "")[:MAX_DETAIL]
            else:
                pod.signals[name].value = float(value)
    return msg


class DecodeError(PeerError, ValueError):
    """An update that breaks the bounds (too many pods or signals)."""


def decode(msg: pb.NodeUpdate, received_at: float, stale_after: float,
           node: str = "") -> list[PodRecord]:
    """The records of an update, timestamped with the subscriber's receipt time, placed on
    ``node`` (the node the subscriber knows the agent runs on; default: its claim)."""
    node = node or msg.node
    if len(msg.pods) > MAX_PODS_PER_NODE:
        raise DecodeError(f"{len(msg.pods)} pods on one node (bound {MAX_PODS_PER_NODE})")
    out = []
    for p in msg.pods:
        if len(p.signals) > MAX_SIGNALS:
            raise DecodeError(f"{len(p.signals)} signals on one pod (bound {MAX_SIGNALS})")
        signals: dict[str, Reading] = {}
        reasons: dict[str, str] = {}
        for name, r in p.signals.items():
            signals[name] = _ABSENT.get(r.absent, Absent.UNAVAILABLE) if r.absent else r.value
            if r.absent and r.detail:
                reasons[name] = r.detail[:MAX_DETAIL]
        owner = OwnerRef(p.owner_kind, p.owner_name) if p.owner_kind else None
        out.append(PodRecord(p.namespace, p.name, node, dict(p.labels), owner, p.ready,
                             signals, received_at, stale_after, reasons))
    return out
