"""The read-only Inspect service over real gRPC on the KEDA port: Fleet, Explain (now, at a
recorded moment, refused), Usage, and which triggers it remembers. The device records
behind them: test_device_records.py."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import grpc
import pytest

from gpuscale.proto import externalscaler_pb2 as kpb
from gpuscale.proto import externalscaler_pb2_grpc as kpb_grpc
from gpuscale.proto import inspect_pb2 as pb
from gpuscale.proto import inspect_pb2_grpc as pb_grpc
from gpuscale.scaler.answers import Answers
from gpuscale.scaler.core.trigger import parse_metadata
from gpuscale.scaler.edges.inspect import SERVICE, Inspector, add_to_server
from gpuscale.scaler.edges.keda import ScalerServer, ScalerService
from gpuscale.scaler.recorder import Recorder
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.telemetry.model import Absent
from tests.scaler.fleet_records import GPU, MIG, devices, rec
from tests.support.clock import Clock


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


async def test_a_planned_answer_counts_its_ready_pods(served: Served, fleet: FleetView,
                                                      clock: Clock) -> None:
    """One source for explain's table and its JSON: the planned answer's ``ready`` is the
    selection's Ready pods, as every other signal's (it was 0 beside a table of Ready pods)."""
    from tests.scaler.test_planner_service import METADATA, pod

    ref = kpb.ScaledObjectRef(name="chat", namespace="llm", scalerMetadata=METADATA)
    fleet.update_node("node-a", [pod("v-0", 1.2, at=clock.now), pod("v-1", 1.2, at=clock.now),
                                 pod("v-2", 0.0, at=clock.now, ready=False)])
    await served.keda.GetMetrics(kpb.GetMetricsRequest(
        scaledObjectRef=ref, metricName="s0-gpuscale-planned-replicas"))
    explained = await served.stub.Explain(pb.ExplainRequest(namespace="llm", name="chat"))
    assert sum(p.ready for p in explained.pods) == 2
    assert (explained.answers[0].counted, explained.answers[0].ready) == (3, 2)


async def test_a_moment_not_recorded_is_said_in_readable_times(served: Served,
                                                               fleet: FleetView) -> None:
    await ask(served)
    served.inspector.recorder.record_now()
    wall = 1_800_000_000.0 + fleet.now()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await served.stub.Explain(pb.ExplainRequest(namespace="llm", name="so",
                                                    at=wall - 3600.0))
    assert err.value.code() is grpc.StatusCode.OUT_OF_RANGE
    details = err.value.details() or ""
    recorded = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(wall))
    assert f"runs from {recorded} to {recorded} (1 moment, one every " in details
    assert "before it" in details
    assert str(int(wall)) not in details  # no epoch seconds
