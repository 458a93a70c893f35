"""Node reports across the stream and into a sink: the codec both ways, the publisher's
cadence, and the one rule both kinds of sink follow - an incomplete report changes
nothing, so a fleet view never sees it as an empty node."""

from __future__ import annotations

import gc
from collections.abc import Iterable, Sequence
from typing import Any

from gpuscale.attribution.model import OwnerRef
from gpuscale.common.errors import Unavailable
from gpuscale.proto import telemetry_pb2 as pb
from gpuscale.scaler.core.selector import parse_selector
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.stream.codec import MAX_DEVICES_PER_NODE as MAX_DEVICES
from gpuscale.stream.codec import MAX_NAME, MAX_PODS_PER_NODE, decode_report, encode_report
from gpuscale.stream.publisher import DEVICES_EVERY_S, TelemetryPublisher
from gpuscale.stream.records import DeviceRecord, NodeReport, PodRecord, deliver
from gpuscale.telemetry.model import Absent
from tests.support.clock import Clock

GPU = "GPU-00000000-0000-0000-0000-000000000000"


def pod(name: str, util: float | Absent, at: float = 500.0) -> PodRecord:
    return PodRecord("llm", name, "node-a", {"app": "vllm"}, OwnerRef("Deployment", "vllm"),
                     True, {"gpu-utilization": util}, at,
                     reasons={"gpu-utilization": "shared"} if util is Absent.SHARED else {})


def complete(seq: int, *pods: PodRecord) -> NodeReport:
    return NodeReport("node-a", seq, 500.0, 1.0, pods,
                      (DeviceRecord(GPU, 0, "NVIDIA L4", pods=("llm/v-0",)),))


def incomplete(seq: int, why: str = "pod metadata not known yet for llm/v-1") -> NodeReport:
    return NodeReport("node-a", seq, 500.0, 1.0, Unavailable(why))


def test_a_report_crosses_the_stream_on_the_receiver_s_clock() -> None:
    pods = (pod("v-0", 60.0), pod("v-1", Absent.SHARED))
    msg = encode_report(complete(3, *pods), "agent-1", wall_time=1.7e9)
    assert (msg.node, msg.agent_id, msg.seq, msg.sampled_at, msg.interval) == (
        "node-a", "agent-1", 3, 1.7e9, 1.0)
    got = decode_report(msg, received_at=20.0, stale_after=3.0, node="node-b")
    assert got == NodeReport("node-b", 3, 20.0, 1.0, tuple(
        PodRecord(r.namespace, r.name, "node-b", r.labels, r.owner, r.ready, r.signals, 20.0,
                  3.0, r.reasons) for r in pods), complete(3).devices)
    no_news = encode_report(NodeReport("node-a", 4, 500.0, 1.0, ()), "agent-1", 0.0)
    assert decode_report(no_news, 21.0, 3.0).devices is None


def test_an_incomplete_report_crosses_as_its_reason_only() -> None:
    msg = encode_report(incomplete(5, "x" * 500), "agent-1", wall_time=0.0)
    assert not msg.attribution_ok
    assert msg.attribution_detail == "x" * 200
    assert not msg.pods
    assert not msg.has_devices
    assert decode_report(msg, 20.0, 3.0) == NodeReport("node-a", 5, 20.0, 1.0,
                                                       Unavailable("x" * 200))
    # What such an update carries besides is not read (not even to refuse it).
    hostile = pb.NodeUpdate(node="n", agent_id="a", seq=1, interval=1.0)
    for i in range(MAX_PODS_PER_NODE + 1):
        hostile.pods.add(namespace="llm", name=f"p{i}")
    assert decode_report(hostile, 1.0, 3.0).pods == Unavailable("attribution unavailable")


class Sink:
    def __init__(self) -> None:
        self.calls: list[tuple[str, list[PodRecord], Sequence[DeviceRecord] | None]] = []

    def update_node(self, source: str, records: Iterable[PodRecord],
                    devices: Sequence[DeviceRecord] | None = None,
                    stale_after: float = 0.0) -> None:
        self.calls.append((source, list(records), devices))

    def remove_node(self, source: str) -> None:
        raise AssertionError("not called here")


def test_an_incomplete_report_never_reaches_a_sink() -> None:
    sink = Sink()
    assert not deliver(incomplete(1), sink, "10.0.0.1:9401")
    assert sink.calls == []  # not an empty update: no update
    assert deliver(complete(2, pod("v-0", 60.0)), sink, "10.0.0.1:9401")
    assert deliver(NodeReport("node-a", 3, 500.0, 1.0, ()), sink, "10.0.0.1:9401")
    assert sink.calls == [("10.0.0.1:9401", [pod("v-0", 60.0)], complete(2).devices),
                          ("10.0.0.1:9401", [], None)]


def test_a_fleet_view_keeps_the_last_complete_pods_through_incomplete_reports(
        clock: Clock) -> None:
    """The safety promise: not known is not zero. The view keeps the node's last pods,
    which age (their workloads turn UNAVAILABLE past the staleness bound), and the node
    itself is not refreshed."""
    fleet = FleetView(stale_after=3.0, monotonic=clock)
    deliver(incomplete(1), fleet, "node-a")
    assert fleet.nodes() == {}
    assert fleet.pod_count() == 0
    deliver(complete(2, pod("v-0", 60.0, at=clock.now)), fleet, "node-a")
    clock.now += 5.0
    deliver(incomplete(3), fleet, "node-a")
    assert fleet.nodes() == {"node-a": 5.0}
    [kept] = fleet.select("llm", parse_selector("app=vllm"))
    assert kept == pod("v-0", 60.0, at=1000.0)
    assert fleet.age(kept) == 5.0
    assert fleet.devices()["node-a"] == complete(2).devices


class Context:
    def peer(self) -> str:
        return "ipv4:127.0.0.1:5555"


async def test_publisher_sends_device_news_every_few_seconds_and_at_once_to_a_newcomer(
        ) -> None:
    pub = TelemetryPublisher("node-a", 1.0)
    carried = []
    for seq in range(1, int(2 * DEVICES_EVERY_S) + 1):
        pub.publish_report(complete(seq, pod("v-0", 1.0)))
        assert pub._latest is not None
        assert pub._latest.seq == seq
        carried.append(pub._latest.has_devices)
    assert carried == [True, *[False] * (int(DEVICES_EVERY_S) - 1)] * 2
    last = len(carried)
    pub.publish_report(incomplete(last + 1))
    context: Any = Context()  # what Subscribe asks of its gRPC context
    stream: Any = pub.Subscribe(pb.SubscribeRequest(subscriber="test"), context)
    first = await anext(stream)  # the latest update, incomplete: not an older complete one
    assert (first.seq, first.attribution_ok, len(first.pods)) == (last + 1, False, 0)
    pub.publish_report(complete(last + 2, pod("v-0", 1.0)))
    second = await anext(stream)  # the newcomer gets the devices at once
    assert (second.seq, second.has_devices, len(second.pods)) == (last + 2, True, 1)
    pub.stopping.set()
    await stream.aclose()


def test_device_news_due_on_an_incomplete_update_goes_on_the_next_complete_one() -> None:
    """An agent whose pods are not known yet (start-up, an attribution outage) sends no
    devices; the news it owes goes with its first complete update, not 5 s later."""
    pub = TelemetryPublisher("node-a", 1.0)

    def carried(report: NodeReport) -> bool:
        pub.publish_report(report)
        assert pub._latest is not None
        return pub._latest.has_devices

    assert not carried(incomplete(1))  # due (the first update), but nothing to carry
    assert carried(complete(2, pod("v-0", 1.0)))
    assert not carried(complete(3, pod("v-0", 1.0)))  # and then every DEVICES_EVERY_S


def referents(obj: object) -> list[object]:
    """What ``obj`` holds, as the cyclic collector sees it (its class aside)."""
    return [o for o in gc.get_referents(obj) if o is not None and o is not type(obj)]


def test_devices_are_decoded_when_first_read_not_when_received() -> None:
    """A scaler reads a node's devices once in its recorder's step, while they arrive every
    few seconds: received, they stay as the update carried them (no records for the
    collector to walk); read, they are the records, equal to any sequence of them, and the
    update is let go."""
    report = complete(3, pod("v-0", 60.0))
    got = decode_report(encode_report(report, "agent-1", 0.0), 20.0, 3.0).devices
    assert got is not None
    assert not [o for o in referents(got) if isinstance(o, DeviceRecord)]
    assert [type(o) for o in referents(got)] == [pb.NodeUpdate, tuple]
    assert got == report.devices
    assert got == list(report.devices or ())
    assert got[0] == got[-1] == DeviceRecord(GPU, 0, "NVIDIA L4", pods=("llm/v-0",))
    assert (len(got), list(got), got[:1]) == (1, list(report.devices or ()), report.devices)
    assert not [o for o in referents(got) if isinstance(o, pb.NodeUpdate)]
    others: list[object] = [[], (DeviceRecord(GPU, 1, "NVIDIA L4"),), "GPU"]
    for other in others:
        assert got != other
    assert "NVIDIA L4" in repr(got)
    # what the fleet view keeps is what it was given, still undecoded until read
    fleet = FleetView()
    fresh = decode_report(encode_report(report, "agent-1", 0.0), 20.0, 3.0)
    deliver(fresh, fleet, "node-a")
    assert fleet.devices()["node-a"] is fresh.devices
    listed = list(report.devices or ())
    fleet.update_node("node-b", [], listed)
    listed.clear()  # a caller's list changed afterwards does not change the view
    assert fleet.devices()["node-b"] == report.devices


def test_undecoded_devices_keep_only_the_devices_within_the_bound() -> None:
    """What a node's undecoded devices keep alive until read: a message of their own, no
    pods, no devices past MAX_DEVICES_PER_NODE - not the update, whose memory (protobuf's
    arena) would all stay with it. The update is left as it came."""
    many = tuple(DeviceRecord(f"GPU-{i}", i, "NVIDIA L4") for i in range(MAX_DEVICES + 5))
    msg = encode_report(NodeReport("node-a", 1, 0.0, 1.0, (pod("v-0", 1.0),), many), "a", 0.0)
    report = decode_report(msg, 20.0, 3.0)
    assert report.devices is not None
    [held] = [o for o in referents(report.devices) if isinstance(o, pb.NodeUpdate)]
    assert held is not msg
    assert (len(held.pods), len(held.devices)) == (0, MAX_DEVICES)
    assert (len(msg.pods), len(msg.devices)) == (1, MAX_DEVICES + 5)
    assert isinstance(report.pods, tuple)
    assert [p.name for p in report.pods] == ["v-0"]
    assert report.devices == many[:MAX_DEVICES]


def test_owner_names_are_bounded_before_they_are_shared() -> None:
    """Owners outlive their pods in the shared cache: a name longer than any Kubernetes
    name (253) is cut before it is kept."""
    hostile = pb.NodeUpdate(node="n", agent_id="a", seq=1, interval=1.0,
                            attribution_ok=True)
    hostile.pods.add(namespace="llm", name="v-0", owner_kind="K" * 5000,
                     owner_name="x" * 100_000)
    pods = decode_report(hostile, 1.0, 3.0).pods
    assert isinstance(pods, tuple)
    [got] = pods
    assert got.owner is not None
    assert (len(got.owner.kind), len(got.owner.name)) == (320, 320)


def test_records_of_one_owner_share_one_owner_ref() -> None:
    """8,000 pod records a second at 1,000 nodes: their owners are shared, not made anew
    (fewer objects for the collector), and stay equal to what was sent."""
    report = complete(3, pod("v-0", 60.0), pod("v-1", 50.0))
    first = decode_report(encode_report(report, "agent-1", 0.0), 20.0, 3.0).pods
    again = decode_report(encode_report(report, "agent-1", 0.0), 21.0, 3.0).pods
    assert isinstance(first, tuple)
    assert isinstance(again, tuple)
    assert first[0].owner is first[1].owner is again[0].owner
    assert first[0].owner == OwnerRef("Deployment", "vllm")


def test_the_claims_beside_a_devices_pods_cross_the_stream_bounded() -> None:
    """A device's DRA claims ride beside its pods, one each; an update whose claims are not
    one per pod keeps its pods and drops the claims (not guessed); names are cut."""
    held = DeviceRecord(GPU, 0, "NVIDIA L4", pods=("llm/v-0", "llm/v-1"),
                        claims=("", "llm/v-1-gpu-x7k2q"))
    report = NodeReport("node-a", 1, 500.0, 1.0, (pod("v-0", 1.0),), (held,))
    msg = encode_report(report, "agent-1", 0.0)
    assert list(msg.devices[0].claims) == ["", "llm/v-1-gpu-x7k2q"]
    got = decode_report(msg, 20.0, 3.0).devices
    assert got is not None
    assert got[0] == held
    assert got[0].holders() == ["llm/v-0", "llm/v-1 (claim v-1-gpu-x7k2q)"]
    plain = encode_report(complete(2), "agent-1", 0.0)
    assert list(plain.devices[0].claims) == []  # device-plugin holders only: nothing sent
    del msg.devices[0].claims[:]
    msg.devices[0].claims.extend(["llm/a", "llm/b", "llm/c"])  # three claims, two pods
    odd = decode_report(msg, 20.0, 3.0).devices
    assert odd is not None
    assert (odd[0].pods, odd[0].claims) == (held.pods, ())
    assert odd[0].holders() == ["llm/v-0", "llm/v-1"]
    del msg.devices[0].claims[:]
    msg.devices[0].claims.extend(["", "llm/" + "x" * 100_000])
    long = decode_report(msg, 20.0, 3.0).devices
    assert long is not None
    assert len(long[0].claims[1]) == MAX_NAME
