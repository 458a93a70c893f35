"""A refused call keeps nothing of its request, on every service of KEDA's port.

grpc.aio keeps an aborted call's exception in a reference cycle with the call, freed only
by the collector (whose young generation the scaler makes large, scaler.root): the frames
it passed through must not hold the request. Before, each refused call kept its whole
message until the next collection: 1.9 MB a call with 1 MB namespaces (issue 39). With the
collector off, no refused request may be left among Python's objects after its call.
(What that costs in RSS is bench/bench_hostile.py's.)"""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest

from gpuscale.proto import externalscaler_pb2 as kpb
from gpuscale.proto import externalscaler_pb2_grpc as kpb_grpc
from gpuscale.proto import inspect_pb2 as pb
from gpuscale.proto import inspect_pb2_grpc as pb_grpc
from gpuscale.scaler.answers import Answers
from gpuscale.scaler.edges.inspect import SERVICE, Inspector, add_to_server
from gpuscale.scaler.edges.keda import MAX_DETAILS, ScalerServer, ScalerService
from gpuscale.scaler.recorder import Recorder
from gpuscale.scaler.state.fleet import FleetView


@pytest.fixture
async def channel(fleet: FleetView) -> AsyncIterator[grpc.aio.Channel]:
    service = ScalerService(Answers(fleet))
    inspector = Inspector(Recorder(service.answers, service.history))
    server = ScalerServer(service, host="127.0.0.1", port=0,
                          extra=[(SERVICE, lambda s: add_to_server(inspector, s))])
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        yield ch
    await server.stop(0.5)


async def refused(call: Any) -> str:
    """The details of a call that must end INVALID_ARGUMENT (a stream: its first read)."""
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await (call.read() if hasattr(call, "read") else call)
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    return err.value.details() or ""


async def kept_after(calls: list[tuple[Callable[[Any], Any], Any]]) -> list[Any]:
    """Make ``calls`` (method, request) with the collector off; the refused requests'
    server-side copies still among Python's objects afterwards (the client's own
    excluded: its call objects may keep them)."""
    sent = {id(request) for _, request in calls}
    kinds = tuple({type(request) for _, request in calls})
    gc.collect()
    gc.disable()
    try:
        for method, request in calls:
            assert len(await refused(method(request))) <= MAX_DETAILS
        return [o for o in gc.get_objects() if isinstance(o, kinds) and id(o) not in sent
                and o.ByteSize() > 4000]
    finally:
        gc.enable()


async def test_keda_methods(channel: grpc.aio.Channel) -> None:
    stub = kpb_grpc.ExternalScalerStub(channel)
    long_namespace = kpb.ScaledObjectRef(name="so", namespace="y" * 60_000,
                                         scalerMetadata={"podSelector": "app=vllm"})
    long_value = kpb.ScaledObjectRef(name="so", namespace="llm", scalerMetadata={
        "podSelector": "app=vllm", "profile": "z" * 4000})  # echoed: cut to MAX_DETAILS
    metrics = kpb.GetMetricsRequest(scaledObjectRef=long_namespace, metricName="x")
    methods: list[Callable[[Any], Awaitable[Any] | Any]] = [
        stub.IsActive, stub.GetMetricSpec, stub.StreamIsActive, stub.StreamMetricSpec]
    assert await kept_after([(m, r) for r in (long_namespace, long_value) for m in methods]
                            + [(stub.GetMetrics, metrics)]) == []


async def test_inspect_methods(channel: grpc.aio.Channel) -> None:
    stub = pb_grpc.InspectStub(channel)
    assert await kept_after([
        (stub.Explain, pb.ExplainRequest(namespace="y" * 60_000, name="so")),
        (stub.Fleet, pb.FleetRequest(node="n" * 60_000)),
        (stub.Usage, pb.UsageRequest(namespace="u" * 60_000))]) == []
