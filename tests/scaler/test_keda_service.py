"""Every RPC of the ExternalScaler over real gRPC (loopback and a unix socket), with a client
generated from the contract; health and reflection too."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from gpuscale.proto import externalscaler_pb2 as pb
from gpuscale.proto import externalscaler_pb2_grpc as pb_grpc
from gpuscale.scaler.answers import Answers
from gpuscale.scaler.edges.keda import ScalerServer, ScalerService
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.stream.records import PodRecord
from gpuscale.telemetry.model import Absent, Reading
from tests.support.clock import Clock
from tests.support.relay import MODES, keda_port


def rec(name: str, util: Reading | None = None, *, ns: str = "llm", app: str = "vllm",
        ready: bool = True, at: float = 1000.0, **signals: Reading) -> PodRecord:
    sig: dict[str, Reading] = dict(signals)
    if util is not None:
        sig["gpu-utilization"] = util
    return PodRecord(ns, name, "node-a", {"app": app}, None, ready, sig, at)


@pytest.fixture(params=MODES)
async def stub(fleet: FleetView,
               request: pytest.FixtureRequest) -> AsyncIterator[pb_grpc.ExternalScalerStub]:
    """The contract, served as the scaler serves it: in its own process, and (with
    --answer-process) by its gRPC front relaying each call to it (scaler.edges.relay)."""
    async with keda_port(ScalerService(Answers(fleet), resend_s=0.5), request.param) as (
            port, _), grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield pb_grpc.ExternalScalerStub(channel)


def ref(**md: str) -> pb.ScaledObjectRef:
    return pb.ScaledObjectRef(name="so", namespace="llm",
                              scalerMetadata={"podSelector": "app=vllm", **md})


def metrics(metric: str = "s0-gpuscale-gpu-utilization", **md: str) -> pb.GetMetricsRequest:
    return pb.GetMetricsRequest(scaledObjectRef=ref(**md), metricName=metric)


async def code_of(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    return err.value.code(), err.value.details() or ""


async def test_metric_spec_sets_both_fields(stub: pb_grpc.ExternalScalerStub) -> None:
    spec = await stub.GetMetricSpec(ref(profile="vllm-inference"))
    assert [(m.metricName, m.targetSize, m.targetSizeFloat) for m in spec.metricSpecs] == [
        ("gpuscale-vllm-requests", 32, 32.0), ("gpuscale-vllm-kv-cache", 80, 80.0)]
    small = await stub.GetMetricSpec(ref(targetValue="0.4"))
    assert (small.metricSpecs[0].targetSize, small.metricSpecs[0].targetSizeFloat) == (1, 0.4)


async def test_get_metrics_sums_the_workloads_pods(stub: pb_grpc.ExternalScalerStub,
                                                   fleet: FleetView) -> None:
    fleet.update_node("node-a", [rec("v-0", 80.0), rec("v-1", 65.5), rec("other", 99.0,
                                                                          app="tgi")])
    fleet.update_node("node-b", [rec("v-2", 40.0), rec("elsewhere", 50.0, ns="dev")])
    got = (await stub.GetMetrics(metrics())).metricValues[0]
    assert (got.metricName, got.metricValue, got.metricValueFloat) == (
        "s0-gpuscale-gpu-utilization", 186, 185.5)
    avg = (await stub.GetMetrics(metrics(metricType="Value"))).metricValues[0]
    assert avg.metricValueFloat == pytest.approx(185.5 / 3)


async def test_no_pods_is_zero(stub: pb_grpc.ExternalScalerStub) -> None:
    got = (await stub.GetMetrics(metrics())).metricValues[0]
    assert (got.metricValue, got.metricValueFloat) == (0, 0.0)
    assert (await stub.IsActive(ref())).result is False


async def test_missing_or_stale_data_is_unavailable_never_a_smaller_sum(
        stub: pb_grpc.ExternalScalerStub, fleet: FleetView, clock: Clock) -> None:
    fleet.update_node("node-a", [rec("v-0", 80.0), rec("v-1", Absent.SHARED),
                                 rec("v-2", Absent.UNSUPPORTED)])
    code, details = await code_of(stub.GetMetrics(metrics()))
    assert code is grpc.StatusCode.UNAVAILABLE
    assert "llm/so: 2 of 3 pods have no usable gpu-utilization: llm/v-1 (shared), " \
           "llm/v-2 (unsupported)" in details
    fleet.update_node("node-a", [rec("v-0", 80.0)])
    clock.now += 10  # the agent went quiet
    code, details = await code_of(stub.GetMetrics(metrics()))
    assert code is grpc.StatusCode.UNAVAILABLE
    assert "llm/v-0 (stale: 10.0s old, bound 3.0s)" in details
    code, details = await code_of(stub.IsActive(ref()))
    assert code is grpc.StatusCode.UNAVAILABLE


async def test_engine_signal_missing_says_how_to_fix(stub: pb_grpc.ExternalScalerStub,
                                                     fleet: FleetView) -> None:
    fleet.update_node("node-a", [rec("v-0", 80.0)])
    code, details = await code_of(stub.GetMetrics(
        metrics("s0-gpuscale-vllm-requests", profile="vllm-inference")))
    assert code is grpc.StatusCode.UNAVAILABLE
    assert "no vllm metrics (annotate the pod gpuscale.io/engine=vllm)" in details


async def test_starting_pods_without_data_are_left_out(stub: pb_grpc.ExternalScalerStub,
                                                       fleet: FleetView) -> None:
    fleet.update_node("node-a", [rec("v-0", 50.0), rec("v-new", Absent.NO_DATA, ready=False),
                                 rec("v-warm", 20.0, ready=False)])
    assert (await stub.GetMetrics(metrics())).metricValues[0].metricValueFloat == 70.0


async def test_invalid_metadata_and_metric_names(stub: pb_grpc.ExternalScalerStub) -> None:
    code, details = await code_of(stub.GetMetrics(metrics(vllmEndpoint="http://x")))
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    assert "does not fetch addresses" in details
    code, details = await code_of(stub.GetMetrics(metrics("s0-cpu")))
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    assert "metricName: 's0-cpu' is not one of gpuscale-gpu-utilization" in details
    no_selector = pb.ScaledObjectRef(name="so", namespace="llm", scalerMetadata={})
    code, details = await code_of(stub.GetMetricSpec(no_selector))
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    assert "podSelector: required" in details


async def test_is_active_is_strictly_above_the_threshold(stub: pb_grpc.ExternalScalerStub,
                                                         fleet: FleetView) -> None:
    fleet.update_node("node-a", [rec("v-0", 5.0)])
    assert (await stub.IsActive(ref())).result is False  # 5 is not above 5
    fleet.update_node("node-a", [rec("v-0", 5.5)])
    assert (await stub.IsActive(ref())).result is True
    assert (await stub.IsActive(ref(activationThreshold="10"))).result is False


async def test_stream_is_active_pushes_on_change(stub: pb_grpc.ExternalScalerStub,
                                                 fleet: FleetView) -> None:
    fleet.update_node("node-a", [rec("v-0", 0.0)])
    stream = stub.StreamIsActive(ref())
    assert (await asyncio.wait_for(stream.read(), 5)).result is False
    fleet.update_node("node-a", [rec("v-0", 60.0)])  # load arrives
    assert (await asyncio.wait_for(stream.read(), 5)).result is True  # pushed, no poll
    # Unchanged state is re-sent periodically (resend_s = 0.5 here).
    assert (await asyncio.wait_for(stream.read(), 5)).result is True
    stream.cancel()


@pytest.mark.parametrize("mode", MODES)
async def test_stream_metric_spec_sends_at_once_and_ends_on_shutdown(fleet: FleetView,
                                                                     mode: str) -> None:
    async with keda_port(ScalerService(Answers(fleet)), mode) as (port, stop), \
            grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.ExternalScalerStub(channel)
        specs = stub.StreamMetricSpec(ref())
        first = await asyncio.wait_for(specs.read(), 5)
        assert first.metricSpecs[0].metricName == "gpuscale-gpu-utilization"
        active = stub.StreamIsActive(ref())
        assert (await asyncio.wait_for(active.read(), 5)).result is False
        await stop()  # the SIGTERM path: open streams end cleanly
        assert await asyncio.wait_for(specs.read(), 5) is grpc.aio.EOF
        assert await asyncio.wait_for(active.read(), 5) is grpc.aio.EOF


@pytest.mark.parametrize("mode", MODES)
async def test_health_and_reflection(fleet: FleetView, mode: str) -> None:
    async with keda_port(ScalerService(Answers(fleet)), mode) as (port, _), \
            grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        health: Any = health_pb2_grpc.HealthStub(channel)  # typed for sync channels
        for name in ("", "externalscaler.ExternalScaler"):
            resp = await health.Check(health_pb2.HealthCheckRequest(service=name))
            assert resp.status == health_pb2.HealthCheckResponse.SERVING
        refl: Any = reflection_pb2_grpc.ServerReflectionStub(channel)  # type: ignore[arg-type]
        call = refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(
            list_services="")]))
        services = {s.name async for r in call for s in r.list_services_response.service}
        assert {"externalscaler.ExternalScaler", "grpc.health.v1.Health",
                "grpc.reflection.v1alpha.ServerReflection"} <= services


async def test_concurrent_callers_agree(stub: pb_grpc.ExternalScalerStub,
                                        fleet: FleetView) -> None:
    fleet.update_node("node-a", [rec(f"v-{i}", float(i)) for i in range(50)])
    answers = await asyncio.gather(*(stub.GetMetrics(metrics()) for _ in range(200)))
    assert {a.metricValues[0].metricValueFloat for a in answers} == {sum(range(50))}


async def test_unix_socket(fleet: FleetView) -> None:
    path = f"/tmp/gs-scaler-{os.getpid()}.sock"
    server = ScalerServer(ScalerService(Answers(fleet)), host=f"unix:{path}", port=0)
    await server.start()
    try:
        fleet.update_node("node-a", [rec("v-0", 12.0)])
        async with grpc.aio.insecure_channel(f"unix:{path}") as channel:
            stub = pb_grpc.ExternalScalerStub(channel)
            got = await stub.GetMetrics(metrics())
            assert got.metricValues[0].metricValueFloat == 12.0
    finally:
        await server.stop(0.5)  # gRPC removes the socket file


@pytest.mark.parametrize("mode", MODES)
async def test_answers_are_counted_by_method_and_status(fleet: FleetView, mode: str) -> None:
    counted: list[tuple[str, str]] = []
    service = ScalerService(Answers(fleet), count=lambda m, c: counted.append((m, c)))
    async with keda_port(service, mode) as (port, _), \
            grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.ExternalScalerStub(channel)
        fleet.update_node("node-a", [rec("v-0", Absent.SHARED)])
        await stub.GetMetricSpec(ref())
        await code_of(stub.GetMetrics(metrics()))
        await code_of(stub.IsActive(ref(profile="nope")))
    assert counted == [("GetMetricSpec", "OK"), ("GetMetrics", "UNAVAILABLE"),
                       ("IsActive", "INVALID_ARGUMENT")]
