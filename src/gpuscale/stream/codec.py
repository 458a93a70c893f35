"""NodeReport <-> telemetry.proto messages (pure)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import lru_cache
from typing import overload

from gpuscale.attribution.model import OwnerRef
from gpuscale.common.errors import PeerError, Unavailable
from gpuscale.proto import telemetry_pb2 as pb
from gpuscale.stream.records import DeviceRecord, NodeReport, PodRecord
from gpuscale.telemetry.model import Absent, Reading

MAX_PODS_PER_NODE = 2048
MAX_SIGNALS = 32
MAX_DETAIL = 200
MAX_DEVICES_PER_NODE = 512  # 8-16 GPUs x 7 MIG instances is the real range
MAX_HOLDERS = 256  # pods holding one device (time-slicing replicas)
MAX_NAME = 320  # a "namespace/name" is at most 63 + 1 + 253
MAX_OWNERS = 16_384  # distinct (kind, name) owners shared between records
_ABSENT = {a.value: a for a in Absent}


def encode_report(report: NodeReport, agent_id: str, wall_time: float) -> pb.NodeUpdate:
    """One update from one tick's report: the node's pods and devices, or, when its pods
    are not known, why not (``attribution_ok=False``, no pods, no devices: the subscriber
    keeps what it had, which ages). ``wall_time`` (seconds since the epoch) goes in the
    update's ``sampled_at``, from which receivers measure the stream's delay: the report's
    own ``sampled_at`` is on the agent's monotonic clock, which means nothing elsewhere."""
    msg = pb.NodeUpdate(node=report.node, agent_id=agent_id, seq=report.seq,
                        sampled_at=wall_time, interval=report.interval,
                        attribution_ok=report.complete,
                        attribution_detail=report.reason[:MAX_DETAIL])
    if isinstance(report.pods, Unavailable):
        return msg
    for r in report.pods:
        pod = msg.pods.add(namespace=r.namespace, name=r.name, ready=r.ready,
                           owner_kind=r.owner.kind if r.owner else "",
                           owner_name=r.owner.name if r.owner else "")
        pod.labels.update(r.labels)
        for name, value in r.signals.items():
            put_reading(pod.signals[name], value)
            if isinstance(value, Absent):
                pod.signals[name].detail = r.reasons.get(name, "")[:MAX_DETAIL]
    if report.devices is not None:
        msg.has_devices = True
        for d in report.devices:
            put_device(msg.devices.add(), d)
    return msg


def put_device(msg: pb.Device, d: DeviceRecord) -> None:
    """Fill ``msg`` (an empty Device) from ``d``."""
    msg.uuid, msg.parent_uuid, msg.index = d.uuid, d.parent_uuid, d.index
    msg.model, msg.sharing = d.model, d.sharing
    msg.pods.extend(d.pods)
    if any(d.claims):
        msg.claims.extend(d.claims)
    put_reading(msg.utilization, d.utilization)
    put_reading(msg.memory_used, d.memory_used_mib)
    put_reading(msg.memory_total, d.memory_total_mib)


def put_reading(msg: pb.Reading, value: Reading) -> None:
    if isinstance(value, Absent):
        msg.absent = value.value
    else:
        msg.value = float(value)


def _get(msg: pb.Reading) -> Reading:
    return _ABSENT.get(msg.absent, Absent.UNAVAILABLE) if msg.absent else msg.value


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
            signals[name] = _get(r)
            if r.absent and r.detail:
                reasons[name] = r.detail[:MAX_DETAIL]
        owner = (_owner(p.owner_kind[:MAX_NAME], p.owner_name[:MAX_NAME]) if p.owner_kind
                 else None)
        out.append(PodRecord(p.namespace, p.name, node, dict(p.labels), owner, p.ready,
                             signals, received_at, stale_after, reasons))
    return out


@lru_cache(maxsize=MAX_OWNERS)
def _owner(kind: str, name: str) -> OwnerRef:
    """One OwnerRef per (kind, name), shared by every record of that owner's pods: a
    scaler decodes 8,000 pod records a second at 1,000 nodes, and an owner made anew for
    each would be 8,000 more objects for the cyclic collector's young generation to walk
    (bench/bench_ingest.py). Bounded: the least recently seen owners are dropped first,
    and names are cut at MAX_NAME (Kubernetes allows 253) before they are kept."""
    return OwnerRef(kind, name)


def decode_report(msg: pb.NodeUpdate, received_at: float, stale_after: float,
                  node: str = "") -> NodeReport:
    """An update as the report it was made from, on the receiver's clock (``received_at``,
    monotonic) and placed on ``node`` (see ``decode``). An update that says its pods are
    not known decodes to ``Unavailable`` with its reason, its pods left unread. Devices
    are decoded when read (``WireDevices``)."""
    node = node or msg.node
    if not msg.attribution_ok:
        why = Unavailable(msg.attribution_detail[:MAX_DETAIL] or "attribution unavailable")
        return NodeReport(node, msg.seq, received_at, msg.interval, why)
    pods = tuple(decode(msg, received_at, stale_after, node))
    if not msg.has_devices:
        return NodeReport(node, msg.seq, received_at, msg.interval, pods)
    # A message of their own (~4 µs for 8 GPUs): kept, the update itself - even with its
    # pods cleared - would keep all of its memory (protobuf's upb frees a message's arena
    # only with the message).
    held = pb.NodeUpdate(has_devices=True)
    held.devices.extend(msg.devices[:MAX_DEVICES_PER_NODE])
    return NodeReport(node, msg.seq, received_at, msg.interval, pods, WireDevices(held))


class WireDevices(Sequence[DeviceRecord]):
    """An update's devices, decoded (``decode_devices``) when first read, not when
    received. A scaler reads a node's devices once in DEVICE_STEP_S (15 s: its recorder)
    or when an operator tool asks, while agents send them every DEVICES_EVERY_S (5 s):
    decoded at receipt, records would be made, and walked by the cyclic collector, for
    two sends in three that nobody reads. Until then it holds a message with the update's
    devices only, at most MAX_DEVICES_PER_NODE of them (``decode_report``; names and
    holders are cut when decoded); once decoded, only the records. Equal to any sequence
    of the same records."""

    __slots__ = ("_msg", "_records")

    def __init__(self, msg: pb.NodeUpdate) -> None:
        self._msg: pb.NodeUpdate | None = msg
        self._records: tuple[DeviceRecord, ...] = ()

    def _decoded(self) -> tuple[DeviceRecord, ...]:
        msg = self._msg
        if msg is not None:  # (two readers at once decode twice, the same records)
            self._records = tuple(decode_devices(msg) or ())
            self._msg = None
        return self._records

    @overload
    def __getitem__(self, i: int) -> DeviceRecord: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[DeviceRecord]: ...

    def __getitem__(self, i: int | slice) -> DeviceRecord | Sequence[DeviceRecord]:
        return self._decoded()[i]

    def __len__(self) -> int:
        return len(self._decoded())

    def __iter__(self) -> Iterator[DeviceRecord]:
        return iter(self._decoded())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, WireDevices | tuple | list):
            return self._decoded() == tuple(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to lists, which hash not

    def __repr__(self) -> str:
        return f"WireDevices({self._decoded()!r})"


def decode_devices(msg: pb.NodeUpdate) -> list[DeviceRecord] | None:
    """The devices of an update (None when it carries none: keep the last), bounded:
    devices beyond MAX_DEVICES_PER_NODE and holders beyond MAX_HOLDERS are dropped, long
    names cut. Never an error: devices are for the operator tools, and must not end the
    stream that carries KEDA's pods."""
    if not msg.has_devices:
        return None
    out = []
    for d in msg.devices[:MAX_DEVICES_PER_NODE]:
        out.append(DeviceRecord(d.uuid[:MAX_NAME], d.index, d.model[:MAX_NAME],
                                d.parent_uuid[:MAX_NAME], d.sharing[:32],
                                _get(d.utilization), _get(d.memory_used),
                                _get(d.memory_total),
                                tuple(p[:MAX_NAME] for p in d.pods[:MAX_HOLDERS]),
                                _claims(d)))
    return out


def _claims(d: pb.Device) -> tuple[str, ...]:
    """The claims beside a device's pods, bounded as they are; none when they are not one
    per pod (a malformed update: the holders stay, their claims are not guessed)."""
    if not d.claims or len(d.claims) != len(d.pods):
        return ()
    return tuple(c[:MAX_NAME] for c in d.claims[:MAX_HOLDERS])
