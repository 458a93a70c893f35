"""The device records agents stream to the scaler: across the stream (hostile lists cut to
the bounds), their cadence, real agents' MIG and time-sliced GPUs as Inspect.Fleet shows
them, and the bounded histories behind explain --at and idle."""

from __future__ import annotations

import grpc
import pytest

from gpuscale.common.errors import Unavailable
from gpuscale.proto import inspect_pb2 as pb
from gpuscale.proto import inspect_pb2_grpc as pb_grpc
from gpuscale.proto import telemetry_pb2 as tpb
from gpuscale.scaler.answers import Answers
from gpuscale.scaler.core.trigger import parse_metadata
from gpuscale.scaler.edges.inspect import SERVICE, Inspector, add_to_server
from gpuscale.scaler.edges.keda import ScalerServer, ScalerService
from gpuscale.scaler.recorder import Recorder
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.scaler.state.history import (
    DeviceHistory,
    RecordedAnswers,
    TargetAnswer,
    TriggerHistory,
)
from gpuscale.stream.codec import (
    MAX_DEVICES_PER_NODE,
    MAX_HOLDERS,
    decode_devices,
    encode_report,
)
from gpuscale.stream.records import DeviceRecord, NodeReport, PodRecord
from tests.scaler.fleet_records import GPU, MIG, devices, rec


def test_devices_cross_the_stream_and_hostile_lists_are_cut() -> None:
    """Devices are for operators: a hostile list is cut to the bounds, never an error that
    would end the stream carrying the node's pods (KEDA's answers). An update without
    device news says so (None: keep the last), distinct from a node with no devices."""
    def update(pods: tuple[PodRecord, ...] | Unavailable,
               devs: list[DeviceRecord] | None = None) -> tpb.NodeUpdate:
        return encode_report(NodeReport("n", 1, 0.0, 1.0, pods,
                                        tuple(devs) if devs is not None else None), "id", 0.0)

    msg = update((rec("v-0", 1.0),), devices("llm/v-0"))
    assert decode_devices(msg) == devices("llm/v-0")
    assert decode_devices(update((rec("v-0", 1.0),))) is None
    assert decode_devices(update((), [])) == []
    assert decode_devices(update(Unavailable("no attribution"))) is None
    many = update((), [DeviceRecord(f"GPU-{i}", i, "x")
                       for i in range(MAX_DEVICES_PER_NODE + 1)])
    assert len(decode_devices(many) or ()) == MAX_DEVICES_PER_NODE
    crowded = update((), [DeviceRecord(GPU, 0, "x",
                                       pods=tuple(f"ns/p{i}" for i in range(1000)))])
    assert len((decode_devices(crowded) or [])[0].pods) == MAX_HOLDERS
    long = decode_devices(update((), [DeviceRecord(
        "G" * 5000, 0, "m" * 5000, pods=("p" * 5000,))])) or []
    assert max(len(long[0].uuid), len(long[0].model), len(long[0].pods[0])) <= 320


def test_device_news_every_few_seconds_and_the_view_keeps_the_last(fleet: FleetView) -> None:
    """The publisher sends devices on the first update and then every DEVICES_EVERY_S; the
    fleet view keeps a node's last devices through updates without news."""
    from gpuscale.stream.publisher import DEVICES_EVERY_S, TelemetryPublisher

    pub = TelemetryPublisher("node-a", 1.0)
    carried = []

    def publish(seq: int) -> None:
        pub.publish_report(NodeReport("node-a", seq, 0.0, 1.0, (rec("v-0", 1.0),),
                                      tuple(devices("llm/v-0"))))

    for seq in range(1, int(3 * DEVICES_EVERY_S) + 1):
        publish(seq)
        assert pub._latest is not None
        carried.append(pub._latest.has_devices)
    assert carried[0]
    assert sum(carried) == 3
    pub._devices_seq = pub._seq  # as if it had just sent them
    publish(pub._seq + 1)
    assert pub._latest is not None
    assert not pub._latest.has_devices
    fleet.update_node("node-a", [rec("v-0", 1.0)], devices("llm/v-0"))
    fleet.update_node("node-a", [rec("v-0", 2.0)], None)
    assert fleet.devices()["node-a"] == tuple(devices("llm/v-0"))
    fleet.update_node("node-a", [rec("v-0", 2.0)], [])
    assert fleet.devices()["node-a"] == ()


def test_history_is_bounded() -> None:
    cfg = parse_metadata({"podSelector": "app=a"})
    h = TriggerHistory(max_triggers=3, keep_s=60.0, step_s=15.0)
    for i in range(5):
        h.note("ns", f"so-{i}", {"podSelector": "app=a"}, cfg, float(i))
    assert [k for k, _ in h.items()] == [("ns", "so-2"), ("ns", "so-3"), ("ns", "so-4")]
    h.note("ns", "so-2", {"podSelector": "app=a"}, cfg, 9.0)  # asked again: kept longest
    h.note("ns", "so-5", {"podSelector": "app=a"}, cfg, 10.0)
    assert ("ns", "so-3") not in dict(h.items())
    assert ("ns", "so-2") in dict(h.items())
    for t in range(100):
        h.record("ns", "so-5", RecordedAnswers(
            float(t), (TargetAnswer("m", "s", 1.0, 0.0, float(t)),), 1))
    seen = h.get("ns", "so-5")
    assert seen is not None
    assert len(seen.moments) == 4  # 60 s of 15 s steps
    assert h.at("ns", "so-5", 10.0)[0] is None  # older than what is kept
    d = DeviceHistory(max_devices=2, keep_s=120.0)
    for t in range(0, 600, 15):
        d.sample(float(t), {"n": tuple(DeviceRecord(f"GPU-{i}", i, "x", utilization=50.0)
                                       for i in range(3))}, [])
    logs = list(d.logs(0.0))
    assert d.untracked == {("n", "GPU-2")}  # refused at the bound, said, not evicted
    assert len(logs) == 2
    assert all(len(minutes) <= 3 for _, _, minutes in logs)


async def test_agents_stream_their_devices_to_the_scaler() -> None:
    """Real agents (simulated GPUs, a MIG node and a time-sliced node) -> their telemetry
    streams -> the scaler's subscriber -> Inspect.Fleet: every GPU and MIG instance with
    the pods holding it; a time-sliced GPU names each of its pods."""
    from gpuscale.stream.subscriber import AgentSubscriber
    from gpuscale.telemetry.scenario import load_scenario
    from tests.support.agents import running_agents
    from tests.support.polling import until

    nodes = [*load_scenario("mig-node").nodes, *load_scenario("timesliced-node").nodes]
    fleet = FleetView()
    subscriber = AgentSubscriber(fleet, name="test")
    service = ScalerService(Answers(fleet))
    inspector = Inspector(Recorder(service.answers, service.history, subscriber.states))
    server = ScalerServer(service, host="127.0.0.1", port=0,
                          extra=[(SERVICE, lambda s: add_to_server(inspector, s))])
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    stub = pb_grpc.InspectStub(channel)
    try:
        async with running_agents(nodes) as agents:
            subscriber.set_addresses([f"127.0.0.1:{a.stream_port}" for a in agents])

            async def both() -> pb.FleetReply | None:
                reply = await stub.Fleet(pb.FleetRequest())
                ok = len(reply.nodes) == 2 and all(n.devices for n in reply.nodes)
                return reply if ok else None

            await until(lambda: len(fleet.devices()) == 2 and all(fleet.devices().values()),
                        what="both nodes' devices")
            reply = await both()
            assert reply is not None
    finally:
        await subscriber.close()
        await channel.close()
        await server.stop(0.5)
    by_node = {n.name: n for n in reply.nodes}
    mig = by_node["gpu-node-mig"]
    instances = [d for d in mig.devices if d.parent_uuid]
    assert instances
    assert all(d.model.endswith("gb") for d in instances)
    assert all(d.sharing == "mig" for d in mig.devices if not d.parent_uuid and
               any(i.parent_uuid == d.uuid for i in instances))
    held = {p for d in instances for p in d.pods}
    assert held
    assert held <= {f"{p.namespace}/{p.name}" for p in reply.pods}
    ts = by_node["gpu-node-ts"]
    gpu0 = next(d for d in ts.devices if d.index == 0)
    assert (gpu0.sharing, sorted(gpu0.pods)) == ("time-sliced",
                                                  ["dev/ts-a", "dev/ts-b", "dev/ts-c",
                                                   "dev/ts-d"])
    assert not next(d for d in ts.devices if d.index == 3).pods  # idle: nobody holds it
    ts_a = next(p for p in reply.pods if p.name == "ts-a")
    assert list(ts_a.gpus) == ["GPU 0 time-sliced 1/4"]


def test_a_mig_share_read_late_is_still_learned() -> None:
    """A MIG instance whose memory total is missing on its first sample gets its share
    once it is read (not 1.0 for good)."""
    d = DeviceHistory()
    gpu = DeviceRecord(GPU, 0, "H100", sharing="mig", memory_total_mib=81559.0)
    blind = DeviceRecord(MIG, 0, "3g.40gb", GPU, utilization=10.0, pods=("ns/p",))
    d.sample(60.0, {"n": (gpu, blind)}, [])
    [(_, log, _)] = list(d.logs(0.0))
    assert log.fraction == pytest.approx(3 / 7)  # the profile's slices until memory is read
    seen = DeviceRecord(MIG, 0, "3g.40gb", GPU, utilization=10.0, memory_total_mib=40192.0,
                        pods=("ns/p",))
    d.sample(120.0, {"n": (gpu, seen)}, [])
    [(_, log, _)] = list(d.logs(0.0))
    assert log.fraction == pytest.approx(40192 / 81559)
