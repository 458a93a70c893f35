"""The read-only Inspect service over real gRPC on the KEDA port, the device records the
agents stream, and the bounded history behind explain --at and idle."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from gpuscale.attribution.model import OwnerRef
from gpuscale.common.errors import Unavailable
from gpuscale.proto import externalscaler_pb2 as kpb
from gpuscale.proto import externalscaler_pb2_grpc as kpb_grpc
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
from gpuscale.telemetry.model import Absent, Reading
from tests.support.clock import Clock

GPU = "GPU-00000000-0000-0000-0000-000000000000"
MIG = "MIG-11111111-1111-1111-1111-111111111111"


def rec(name: str, util: Reading, *, ns: str = "llm", node: str = "node-a",
        at: float = 1000.0, ready: bool = True) -> PodRecord:
    return PodRecord(ns, name, node, {"app": "vllm"}, OwnerRef("Deployment", "vllm"), ready,
                     {"gpu-utilization": util}, at)


def devices(*holders: str) -> list[DeviceRecord]:
    return [DeviceRecord(GPU, 0, "NVIDIA H100 80GB HBM3", sharing="mig",
                         utilization=Absent.UNSUPPORTED, memory_used_mib=1000.0,
                         memory_total_mib=81559.0),
            DeviceRecord(MIG, 0, "3g.40gb", GPU, "exclusive", 60.0, 500.0, 40192.0,
                         tuple(holders))]


class Served:
    def __init__(self, service: ScalerService, inspector: Inspector,
                 stub: pb_grpc.InspectStub, keda: kpb_grpc.ExternalScalerStub) -> None:
        self.service, self.inspector, self.stub, self.keda = service, inspector, stub, keda


@pytest.fixture
async def served(fleet: FleetView) -> AsyncIterator[Served]:
    service = ScalerService(Answers(fleet))
    inspector = Inspector(Recorder(service.answers, service.history,
                                   wall=lambda: 1_800_000_000.0 + fleet.now()))
    server = ScalerServer(service, host="127.0.0.1", port=0,
                          extra=[(SERVICE, lambda s: add_to_server(inspector, s))])
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    yield Served(service, inspector, pb_grpc.InspectStub(channel),
                 kpb_grpc.ExternalScalerStub(channel))
    await channel.close()
    await server.stop(0.5)


def keda_ref(name: str = "so", **md: str) -> kpb.ScaledObjectRef:
    return kpb.ScaledObjectRef(name=name, namespace="llm",
                               scalerMetadata={"podSelector": "app=vllm", **md})


async def ask(s: Served, name: str = "so", **md: str) -> None:
    await s.keda.GetMetricSpec(keda_ref(name, **md))


async def test_fleet_lists_nodes_devices_pods_and_workloads(served: Served,
                                                            fleet: FleetView) -> None:
    fleet.update_node("node-a", [rec("v-0", 60.0)], devices("llm/v-0"))
    fleet.update_node("node-b", [rec("t-0", 10.0, ns="dev", node="node-b")])
    await ask(served)
    reply = await served.stub.Fleet(pb.FleetRequest())
    assert {n.name for n in reply.nodes} == {"node-a", "node-b"}
    node_a = next(n for n in reply.nodes if n.name == "node-a")
    assert [(d.uuid, d.parent_uuid, d.model, list(d.pods)) for d in node_a.devices] == [
        (GPU, "", "NVIDIA H100 80GB HBM3", []), (MIG, GPU, "3g.40gb", ["llm/v-0"])]
    assert node_a.devices[0].utilization.absent == "unsupported"  # never a 0
    pod = next(p for p in reply.pods if p.name == "v-0")
    assert list(pod.gpus) == ["MIG 3g.40gb on GPU 0"]
    assert pod.signals["gpu-utilization"].value == 60.0
    assert [(w.namespace, w.name, w.answers[0].value) for w in reply.workloads] == [
        ("llm", "so", 60.0)]
    only = await served.stub.Fleet(pb.FleetRequest(namespace="dev"))
    assert [p.name for p in only.pods] == ["t-0"]
    assert not only.workloads
    node = await served.stub.Fleet(pb.FleetRequest(node="node-b"))
    assert [n.name for n in node.nodes] == ["node-b"]
    assert [p.name for p in node.pods] == ["t-0"]


async def test_explain_now_names_the_pods_and_the_answer(served: Served,
                                                         fleet: FleetView) -> None:
    fleet.update_node("node-a", [rec("v-0", 60.0), rec("v-1", 30.0)], devices("llm/v-0"))
    await ask(served)
    reply = await served.stub.Explain(pb.ExplainRequest(namespace="llm", name="so"))
    assert dict(reply.metadata) == {"podSelector": "app=vllm"}
    assert (reply.selector, reply.value_mode, reply.pod_count) == ("app=vllm", "sum", 2)
    assert [(a.signal, a.value, a.counted, a.unavailable) for a in reply.answers] == [
        ("gpu-utilization", 90.0, 2, "")]
    assert sorted(p.name for p in reply.pods) == ["v-0", "v-1"]
    assert not reply.scale_target.known
    assert reply.scale_target.replicas == -1
    by_owner = await served.stub.Explain(pb.ExplainRequest(namespace="llm", name="vllm"))
    assert by_owner.name == "so"  # the Deployment its pods belong to


async def test_explain_says_unavailable_with_the_reason(served: Served, clock: Clock,
                                                        fleet: FleetView) -> None:
    fleet.update_node("node-a", [rec("v-0", 60.0), rec("v-1", Absent.NO_DATA)])
    await ask(served)
    reply = await served.stub.Explain(pb.ExplainRequest(namespace="llm", name="so"))
    assert "llm/v-1" in reply.answers[0].unavailable
    assert reply.answers[0].value == 0.0
    clock.now += 10.0  # every record now stale
    stale = await served.stub.Explain(pb.ExplainRequest(namespace="llm", name="so"))
    assert "stale" in stale.answers[0].unavailable


async def test_explain_refuses_what_it_cannot_answer(served: Served) -> None:
    await ask(served)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await served.stub.Explain(pb.ExplainRequest(namespace="llm", name="nope"))
    assert err.value.code() is grpc.StatusCode.NOT_FOUND
    assert "known in llm: so" in (err.value.details() or "")
    for bad in (pb.ExplainRequest(namespace="LLM", name="so"),
                pb.ExplainRequest(namespace="llm", name="a/b"),
                pb.ExplainRequest(namespace="llm", name="so", at=float("nan")),
                pb.ExplainRequest(namespace="x" * 300, name="so")):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await served.stub.Explain(bad)
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await served.stub.Explain(pb.ExplainRequest(namespace="llm", name="so", at=1.0))
    assert err.value.code() is grpc.StatusCode.OUT_OF_RANGE  # nothing recorded yet
    for bad_fleet in (pb.FleetRequest(namespace="a/b"), pb.FleetRequest(node="n" * 300)):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await served.stub.Fleet(bad_fleet)
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await served.stub.Usage(pb.UsageRequest(window=-1))
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT


async def test_recorded_moments_answer_explain_at(served: Served, clock: Clock,
                                                  fleet: FleetView) -> None:
    fleet.update_node("node-a", [rec("v-0", 60.0, at=fleet.now())], devices("llm/v-0"))
    await ask(served)
    for util in (60.0, 20.0, 5.0):
        fleet.update_node("node-a", [rec("v-0", util, at=fleet.now())], devices("llm/v-0"))
        served.inspector.recorder.record_now()
        clock.now += 15.0
    first = 1_800_000_000.0 + 1000.0
    reply = await served.stub.Explain(pb.ExplainRequest(namespace="llm", name="so",
                                                        at=first + 16.0, history=600.0))
    assert reply.at == first + 15.0
    assert reply.answers[0].value == 20.0
    assert [p.answers[0].value for p in reply.past] == [60.0]
    assert not reply.pods  # the pods now are not the pods then
    usage = await served.stub.Usage(pb.UsageRequest(window=3600))
    [dev] = usage.devices  # the MIG instance; its GPU (split into MIG) is not a device
    assert (dev.uuid, dev.model) == (MIG, "NVIDIA H100 80GB HBM3 3g.40gb")
    assert dev.fraction == pytest.approx(40192 / 81559)
    assert all(list(m.pods) == ["llm/v-0"] for m in dev.minutes)
    assert all(list(m.owners) == ["Deployment/vllm"] for m in dev.minutes)


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


async def test_a_trigger_the_scaler_refuses_is_not_remembered(served: Served,
                                                              fleet: FleetView) -> None:
    """This scaler has no API access: a trigger without podSelector is INVALID_ARGUMENT to
    KEDA and never becomes a ScaledObject the tools explain, record or list."""
    fleet.update_node("node-a", [rec("v-0", 60.0)])
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await served.keda.GetMetricSpec(kpb.ScaledObjectRef(
            namespace="llm", name="bad", scalerMetadata={"profile": "gpu-utilization"}))
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    await ask(served)
    served.inspector.recorder.record_now()
    reply = await served.stub.Fleet(pb.FleetRequest())
    assert [w.name for w in reply.workloads] == ["so"]
    seen = served.service.history.get("llm", "so")
    assert seen is not None
    assert len(seen.moments) == 1


async def test_a_trigger_that_breaks_does_not_stop_the_others(served: Served,
                                                               fleet: FleetView) -> None:
    """One remembered trigger whose pods cannot be read any more (here: its selector needs
    the API, which this scaler lacks) is UNAVAILABLE with the reason; the rest are
    recorded and listed."""
    fleet.update_node("node-a", [rec("v-0", 60.0)])
    await ask(served)
    md = {"profile": "gpu-utilization"}
    served.service.history.note("llm", "broken", md, parse_metadata(md), fleet.now())
    served.inspector.recorder.record_now()
    reply = await served.stub.Fleet(pb.FleetRequest())
    answers = {w.name: w.answers[0] for w in reply.workloads}
    assert answers["so"].value == 60.0
    assert "podSelector" in answers["broken"].unavailable
    seen = served.service.history.get("llm", "so")
    assert seen is not None
    assert len(seen.moments) == 1


async def test_planned_triggers_read_as_keda_gets_them(served: Served, fleet: FleetView,
                                                       clock: Clock) -> None:
    """The planner's number as KEDA gets it (PlanBook rules, read-only): the plan while
    fresh, UNAVAILABLE once no observation came for stale_s; reading keeps no planner
    alive."""
    from tests.scaler.test_planner_service import METADATA, pod

    ref = kpb.ScaledObjectRef(name="chat", namespace="llm", scalerMetadata=METADATA)
    request = kpb.GetMetricsRequest(scaledObjectRef=ref,
                                    metricName="s0-gpuscale-planned-replicas")
    fleet.update_node("node-a", [pod("v-0", 1.2, at=clock.now), pod("v-1", 1.2, at=clock.now)])
    got = (await served.keda.GetMetrics(request)).metricValues[0].metricValueFloat
    explained = await served.stub.Explain(pb.ExplainRequest(namespace="llm", name="chat"))
    assert explained.answers[0].value == got
    assert explained.planned_replicas * 10 == got
    assert explained.plan_terms
    clock.now += 60.0  # no tick: the plan ages past stale_s
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await served.keda.GetMetrics(request)
    assert err.value.code() is grpc.StatusCode.UNAVAILABLE
    asked = served.service.plans._entries[next(iter(served.service.plans.keys()))].asked_at
    stale = await served.stub.Explain(pb.ExplainRequest(namespace="llm", name="chat"))
    assert "no usable observation" in stale.answers[0].unavailable
    assert served.service.plans._entries[next(iter(served.service.plans.keys()))].asked_at == asked
