"""The ExternalScaler's edges over real gRPC: hostile references and values, bugs,
reflection v1, and the stream's answer when data goes missing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2

from gpuscale.proto import externalscaler_pb2 as pb
from gpuscale.proto import externalscaler_pb2_grpc as pb_grpc
from gpuscale.scaler.answers import Answers
from gpuscale.scaler.core.selector import Selector
from gpuscale.scaler.edges.keda import MAX_MESSAGE, ScalerServer, ScalerService
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.stream.records import PodRecord
from gpuscale.telemetry.model import Absent
from tests.scaler.test_keda_service import code_of, metrics, rec, ref
from tests.support.relay import MODES, keda_port


def engine_rec(name: str, signal: str, value: float) -> PodRecord:
    return PodRecord("llm", name, "node-a", {"app": "vllm"}, None, True,
                     {"gpu-utilization": 50.0, signal: value}, 1000.0)


@pytest.fixture
async def served(fleet: FleetView) -> AsyncIterator[tuple[ScalerService, grpc.aio.Channel]]:
    service = ScalerService(Answers(fleet), resend_s=0.2)
    server = ScalerServer(service, host="127.0.0.1", port=0)
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    yield service, channel
    await channel.close()
    await server.stop(0.5)


@pytest.mark.parametrize(("namespace", "name", "what"), [
    ("x" * 70_000, "so", "namespace"), ("Llm", "so", "namespace"), ("", "so", "namespace"),
    ("llm/../kube-system", "so", "namespace"), ("llm", "../../deployments", "name"),
    ("llm", "", "name"), ("llm", "S" * 300, "name"), ("ll\u00e9", "so", "namespace")])
async def test_references_that_cannot_be_kubernetes_names_are_refused(
        served: tuple[ScalerService, grpc.aio.Channel], namespace: str, name: str,
        what: str) -> None:
    """Checked before anything is cached or looked up: 300 calls with 1 MB namespaces
    used to hold 340 MiB in the selector cache (a 70 KB one is under the message limit:
    it reaches this check)."""
    service, channel = served
    stub = pb_grpc.ExternalScalerStub(channel)
    bad = pb.ScaledObjectRef(name=name, namespace=namespace,
                             scalerMetadata={"podSelector": "app=vllm"})
    for call in (stub.IsActive(bad), stub.GetMetricSpec(bad),
                 stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=bad,
                                                      metricName="gpuscale-gpu-utilization"))):
        code, details = await code_of(call)
        assert code is grpc.StatusCode.INVALID_ARGUMENT
        assert details.startswith(f"{what}: ")
        assert len(details) < 300
    assert service.fleet._select_cache == {}


@pytest.mark.parametrize("mode", MODES)
async def test_an_oversized_message_is_refused_and_the_port_serves_on(
        fleet: FleetView, mode: str) -> None:
    """A request past MAX_MESSAGE (no KEDA message is near it) is refused by gRPC itself,
    RESOURCE_EXHAUSTED with its reason, on every method; the connection and the port go
    on serving well-formed calls. In process and behind the --answer-process front."""
    fleet.update_node("node-a", [rec("v-0", 40.0)])
    async with keda_port(ScalerService(Answers(fleet)), mode) as (port, _), \
            grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.ExternalScalerStub(channel)
        huge = pb.ScaledObjectRef(name="so", namespace="x" * (MAX_MESSAGE + 1),
                                  scalerMetadata={"podSelector": "app=vllm"})
        calls = [stub.IsActive, stub.GetMetricSpec, lambda r: stub.GetMetrics(
            pb.GetMetricsRequest(scaledObjectRef=r, metricName="x"))]
        for i in range(48):
            code, details = await code_of(calls[i % 3](huge))
            assert code is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "larger than max" in details
        for stream in (stub.StreamIsActive(huge), stub.StreamMetricSpec(huge)):
            assert (await code_of(stream.read()))[0] is grpc.StatusCode.RESOURCE_EXHAUSTED
        got = await stub.GetMetrics(metrics())
        assert got.metricValues[0].metricValueFloat == 40.0


@pytest.mark.parametrize("value", [-43.0, float("nan"), float("inf"), 1e300, 1e8])
async def test_implausible_values_are_unavailable_not_summed(
        served: tuple[ScalerService, grpc.aio.Channel], fleet: FleetView,
        value: float) -> None:
    """An engine (or agent) reporting -43 used to lower the sum; 1e300 overflowed into
    an UNKNOWN error counted as a success."""
    _, channel = served
    stub = pb_grpc.ExternalScalerStub(channel)
    fleet.update_node("node-a", [engine_rec("v-0", "vllm-waiting", 3.0),
                                 engine_rec("v-1", "vllm-waiting", value)])
    code, details = await code_of(stub.GetMetrics(metrics(
        "s0-gpuscale-vllm-waiting", signal="vllm-waiting", targetValue="5")))
    assert code is grpc.StatusCode.UNAVAILABLE
    assert "llm/v-1 (implausible vllm-waiting" in details
    assert "outside 0..1e+07 requests" in details


async def test_the_largest_plausible_sum_fits_keda_int64(
        served: tuple[ScalerService, grpc.aio.Channel], fleet: FleetView) -> None:
    _, channel = served
    stub = pb_grpc.ExternalScalerStub(channel)
    fleet.update_node("node-a", [engine_rec(f"v-{i}", "triton-queue-time", 1e9)
                                 for i in range(2000)])
    got = (await stub.GetMetrics(metrics("s0-gpuscale-triton-queue-time",
                                         signal="triton-queue-time",
                                         targetValue="50"))).metricValues[0]
    assert got.metricValueFloat == 2e12
    assert got.metricValue == 2 * 10**12


async def test_a_reason_from_the_agent_reaches_the_answer(
        served: tuple[ScalerService, grpc.aio.Channel], fleet: FleetView) -> None:
    _, channel = served
    stub = pb_grpc.ExternalScalerStub(channel)
    fleet.update_node("node-a", [PodRecord(
        "llm", "v-0", "node-a", {"app": "vllm"}, None, True,
        {"vllm-waiting": Absent.UNAVAILABLE}, 1000.0,
        reasons={"vllm-waiting": "http://10.1.2.3:8000/metrics: no complete answer in 2.0s"})])
    code, details = await code_of(stub.GetMetrics(metrics(
        "s0-gpuscale-vllm-waiting", signal="vllm-waiting", targetValue="5")))
    assert code is grpc.StatusCode.UNAVAILABLE
    assert "llm/v-0 (unavailable: http://10.1.2.3:8000/metrics: no complete answer" in details


class BrokenFleet(FleetView):
    """A bug below the service (not a peer): select raises."""

    def select(self, namespace: str, selector: Selector) -> list[PodRecord]:
        raise RuntimeError("planted bug")


async def test_a_bug_is_internal_logged_and_never_counted_as_ok(
        caplog: pytest.LogCaptureFixture) -> None:
    counted: list[tuple[str, str]] = []
    server = ScalerServer(ScalerService(Answers(BrokenFleet()), count=lambda m, c: counted.append(
        (m, c))), host="127.0.0.1", port=0)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.ExternalScalerStub(channel)
            code, details = await code_of(stub.GetMetrics(metrics()))
            assert code is grpc.StatusCode.INTERNAL
            assert details == ("internal error in gpuscale (RuntimeError); see the "
                               "scaler's log")
            code, _ = await code_of(stub.IsActive(ref()))
            assert code is grpc.StatusCode.INTERNAL
    finally:
        await server.stop(0.2)
    assert counted == [("GetMetrics", "INTERNAL"), ("IsActive", "INTERNAL")]
    assert "planted bug" in caplog.text
    assert "Traceback" in caplog.text


async def test_is_active_depends_on_its_own_trigger_only(
        served: tuple[ScalerService, grpc.aio.Channel], fleet: FleetView) -> None:
    _, channel = served
    stub = pb_grpc.ExternalScalerStub(channel)
    a = pb.ScaledObjectRef(name="a", namespace="llm", scalerMetadata={"podSelector": "app=a"})
    b = pb.ScaledObjectRef(name="b", namespace="llm", scalerMetadata={
        "podSelector": "app=b", "activationThreshold": "50"})
    fleet.update_node("node-a", [rec("a-0", 60.0, app="a"), rec("b-0", 40.0, app="b")])
    assert [(await stub.IsActive(r)).result for r in (a, b)] == [True, False]
    fleet.update_node("node-a", [rec("a-0", 0.0, app="a"), rec("b-0", 40.0, app="b")])
    assert [(await stub.IsActive(r)).result for r in (a, b)] == [False, False]
    fleet.update_node("node-a", [rec("a-0", Absent.LOST, app="a"), rec("b-0", 51.0, app="b")])
    assert (await stub.IsActive(b)).result is True  # a's lost GPU is not b's business
    code, _ = await code_of(stub.IsActive(a))
    assert code is grpc.StatusCode.UNAVAILABLE


async def test_stream_is_active_ends_with_unavailable_then_serves_again(
        served: tuple[ScalerService, grpc.aio.Channel], fleet: FleetView) -> None:
    """An unknown state is said on the stream (ended with the status; KEDA reopens it),
    not left standing as the last pushed answer."""
    service, channel = served
    service.unavailable_grace_s = 0.3
    stub = pb_grpc.ExternalScalerStub(channel)
    fleet.update_node("node-a", [rec("v-0", 60.0)])
    stream = stub.StreamIsActive(ref())
    assert (await asyncio.wait_for(stream.read(), 5)).result is True
    fleet.update_node("node-a", [rec("v-0", Absent.LOST)])
    answers: list[Any] = []

    async def read_to_the_end() -> None:
        while True:
            answers.append(await asyncio.wait_for(stream.read(), 5))

    code, details = await code_of(read_to_the_end())
    assert code is grpc.StatusCode.UNAVAILABLE
    assert "llm/v-0 (lost)" in details
    assert all(a.result is True for a in answers)  # re-sends of the known state only
    fleet.update_node("node-a", [rec("v-0", 0.0)])
    again = stub.StreamIsActive(ref())
    assert (await asyncio.wait_for(again.read(), 5)).result is False
    again.cancel()


async def test_reflection_v1_and_v1alpha(
        served: tuple[ScalerService, grpc.aio.Channel]) -> None:
    """grpcurl asks grpc.reflection.v1 first; the messages are the same on the wire."""
    _, channel = served
    for service in ("grpc.reflection.v1.ServerReflection",
                    "grpc.reflection.v1alpha.ServerReflection"):
        call = channel.stream_stream(
            f"/{service}/ServerReflectionInfo",
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString)
        answers = call(iter([
            reflection_pb2.ServerReflectionRequest(list_services=""),
            reflection_pb2.ServerReflectionRequest(
                file_containing_symbol="externalscaler.ExternalScaler")]))
        got = [r async for r in answers]
        names = {s.name for s in got[0].list_services_response.service}
        assert {"externalscaler.ExternalScaler", "grpc.reflection.v1.ServerReflection",
                "grpc.reflection.v1alpha.ServerReflection"} <= names, service
        assert got[1].file_descriptor_response.file_descriptor_proto, service
