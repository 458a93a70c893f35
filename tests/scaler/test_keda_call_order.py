"""The calls KEDA makes, in KEDA's order, through KEDA's own proto (externalscaler.proto)
over real gRPC: GetMetricSpec when the ScaledObject is reconciled, then per polling interval
GetMetrics followed by IsActive (pkg/scalers/external_scaler.go, GetMetricsAndActivity: a
failed GetMetrics returns before IsActive), with the metric name from the spec (KEDA strips
its ``sN-`` index before the call); and the two push streams for ``external-push``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from gpuscale.models.keda import Keda, ScaledObjectSpec
from gpuscale.proto import externalscaler_pb2 as pb
from gpuscale.proto import externalscaler_pb2_grpc as pb_grpc
from gpuscale.scaler.answers import Answers
from gpuscale.scaler.edges.keda import ScalerServer, ScalerService
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.stream.records import PodRecord
from gpuscale.telemetry.model import Absent
from tests.scaler.test_keda_service import rec
from tests.support.clock import Clock

REF = pb.ScaledObjectRef(name="so", namespace="llm", scalerMetadata={
    "podSelector": "app=vllm", "profile": "vllm-inference"})


def vllm(requests: float, kv_cache: float, at: float = 1000.0) -> PodRecord:
    return PodRecord("llm", "v-0", "node-a", {"app": "vllm"}, None, True,
                     {"vllm-requests": requests, "vllm-kv-cache": kv_cache}, at)


@pytest.fixture
async def keda_client() -> AsyncIterator[tuple[FleetView, Clock, pb_grpc.ExternalScalerStub]]:
    clock = Clock()
    fleet = FleetView(stale_after=3.0, monotonic=clock)
    server = ScalerServer(ScalerService(Answers(fleet), resend_s=0.2), host="127.0.0.1", port=0)
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    yield fleet, clock, pb_grpc.ExternalScalerStub(channel)
    await channel.close()
    await server.stop(0.2)


async def metrics_and_activity(stub: pb_grpc.ExternalScalerStub,
                               names: list[str]) -> tuple[list[float], bool] | None:
    """One KEDA poll of one trigger: every metric, then IsActive; None when any call
    failed (KEDA counts a failure and does not call IsActive after a failed GetMetrics)."""
    values = []
    try:
        for name in names:
            got = await stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=REF,
                                                             metricName=name), timeout=5)
            values.append(got.metricValues[0].metricValueFloat)
        return values, (await stub.IsActive(REF, timeout=5)).result
    except grpc.aio.AioRpcError:
        return None


async def test_polling_in_kedas_order_with_an_outage_and_the_fallback(
        keda_client: tuple[FleetView, Clock, pb_grpc.ExternalScalerStub]) -> None:
    fleet, clock, stub = keda_client
    fleet.update_node("node-a", [vllm(20.0, 40.0)])
    spec = await stub.GetMetricSpec(REF, timeout=5)
    names = [m.metricName for m in spec.metricSpecs]
    assert names == ["gpuscale-vllm-requests", "gpuscale-vllm-kv-cache"]
    keda = Keda(ScaledObjectSpec(fallback_replicas=4, failure_threshold=2))
    history = []
    for poll in range(8):
        now = 30.0 * poll
        if poll == 2:  # the node's agent goes quiet: its data ages past the bound
            clock.now += 10
        if poll == 5:  # and reports again
            fleet.update_node("node-a", [vllm(20.0, 40.0, at=clock.now)])
        answer = await metrics_and_activity(stub, names)
        set_to = keda.poll(now, 2, None if answer is None else answer[1])
        history.append((answer, set_to, keda.fallback_active))
    assert history[0] == (([20.0, 40.0], True), None, False)
    assert [h[0] for h in history[2:5]] == [None, None, None]
    # failureThreshold 2: the third failure in a row is the first above it; KEDA sets no
    # count (the HPA is fed the fallback's value) and the trigger counts as active.
    assert [h[1:] for h in history[2:5]] == [(None, False), (None, False), (None, True)]
    assert history[5] == (([20.0, 40.0], True), None, False)  # back to the scaler's values
    assert keda.failures == 0


async def test_push_streams_as_keda_opens_them(
        keda_client: tuple[FleetView, Clock, pb_grpc.ExternalScalerStub]) -> None:
    fleet, _, stub = keda_client
    fleet.update_node("node-a", [vllm(0.0, 0.0)])
    specs = stub.StreamMetricSpec(REF)
    active = stub.StreamIsActive(REF)
    first = await asyncio.wait_for(specs.read(), 5)
    assert [m.metricName for m in first.metricSpecs] == [
        "gpuscale-vllm-requests", "gpuscale-vllm-kv-cache"]
    assert (await asyncio.wait_for(active.read(), 5)).result is False
    fleet.update_node("node-a", [vllm(3.0, 10.0)])
    assert (await asyncio.wait_for(active.read(), 5)).result is True  # pushed at once
    fleet.update_node("node-a", [rec("v-0", Absent.LOST)])
    code = None
    try:
        while True:
            await asyncio.wait_for(active.read(), 10)
    except grpc.aio.AioRpcError as exc:
        code = exc.code()
    assert code is grpc.StatusCode.UNAVAILABLE
    specs.cancel()
