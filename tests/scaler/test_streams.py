"""KEDA's streams as KEDA opens them: every ScaledObject on ONE connection (KEDA's
``getClientForConnectionPool`` shares one grpc.ClientConn per scalerAddress), one stream of
each kind per push trigger, over real gRPC. The bounds are per trigger identity and by
memory, never per connection (scaler.state.streams)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuscale.common.errors import Overloaded, Superseded
from gpuscale.proto import externalscaler_pb2 as pb
from gpuscale.proto import externalscaler_pb2_grpc as pb_grpc
from gpuscale.scaler.answers import Answers
from gpuscale.scaler.edges.keda import ScalerServer, ScalerService
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.scaler.state.streams import Held, StreamBook
from gpuscale.stream.records import PodRecord
from tests.scaler.test_keda_service import code_of
from tests.scaler.test_planner_service import METADATA as PLANNER
from tests.support.polling import until

Served = tuple[ScalerService, grpc.aio.Channel]


def workload_pod(i: int, util: float = 60.0) -> PodRecord:
    return PodRecord("llm", f"w{i}-0", "node-a", {"app": f"w{i}"}, None, True,
                     {"gpu-utilization": util}, 1000.0)


def so(i: int, **md: str) -> pb.ScaledObjectRef:
    return pb.ScaledObjectRef(name=f"so-{i}", namespace="llm",
                              scalerMetadata={"podSelector": f"app=w{i}", **md})


async def serve(fleet: FleetView, book: StreamBook | None = None,
                ) -> tuple[ScalerService, ScalerServer, grpc.aio.Channel]:
    service = ScalerService(Answers(fleet), resend_s=30.0, streams=book)
    server = ScalerServer(service, host="127.0.0.1", port=0)
    await server.start()
    return service, server, grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")


@pytest.fixture
async def served(fleet: FleetView) -> AsyncIterator[Served]:
    service, server, channel = await serve(fleet)
    yield service, channel
    await channel.close()
    await server.stop(0.5)


async def test_two_thousand_streams_on_one_connection_and_unary_calls_still_answered(
        served: Served, fleet: FleetView) -> None:
    """1,000 push ScaledObjects, each with StreamIsActive and StreamMetricSpec, on the one
    channel KEDA would use: every stream opens and gets its first answer, and GetMetrics,
    IsActive and GetMetricSpec for every workload are answered beside them (the
    per-connection cap refused 1,600 of these 2,000)."""
    service, channel = served
    fleet.update_node("node-a", [workload_pod(i) for i in range(1000)])
    stub = pb_grpc.ExternalScalerStub(channel)
    streams = [call for i in range(1000)
               for call in (stub.StreamIsActive(so(i)), stub.StreamMetricSpec(so(i)))]
    try:
        first = await asyncio.wait_for(
            asyncio.gather(*(s.read() for s in streams), return_exceptions=True), 120)
        assert [f for f in first if isinstance(f, BaseException)] == []
        assert all(f.result is True for f in first[0::2])  # type: ignore[union-attr]
        assert len(service.streams) == 2000
        assert service.streams.count("StreamIsActive") == 1000
        values = await asyncio.wait_for(asyncio.gather(*(
            stub.GetMetrics(pb.GetMetricsRequest(
                scaledObjectRef=so(i), metricName="s0-gpuscale-gpu-utilization"))
            for i in range(1000))), 60)
        assert {v.metricValues[0].metricValueFloat for v in values} == {60.0}
        active = await asyncio.wait_for(asyncio.gather(*(
            stub.IsActive(so(i)) for i in range(0, 1000, 10))), 60)
        assert all(a.result for a in active)
        spec = await stub.GetMetricSpec(so(999), timeout=10)
        assert spec == first[-1]
        assert service.streams.replaced == 0
        assert service.streams.refused == 0
    finally:
        for s in streams:
            s.cancel()
    await until(lambda: len(service.streams) == 0, 10.0, "every place freed")


@pytest.mark.parametrize("kind", ["StreamIsActive", "StreamMetricSpec"])
async def test_a_newer_stream_of_the_same_trigger_replaces_the_old(
        served: Served, fleet: FleetView, kind: str) -> None:
    service, channel = served
    fleet.update_node("node-a", [workload_pod(1)])
    stub = pb_grpc.ExternalScalerStub(channel)
    method = getattr(stub, kind)
    old = method(so(1))
    await asyncio.wait_for(old.read(), 5)
    other = method(so(1, targetValue="50"))  # another trigger (metadata) of the same object
    await asyncio.wait_for(other.read(), 5)
    new = method(so(1))
    await asyncio.wait_for(new.read(), 5)

    async def drain() -> None:
        while True:
            await old.read()

    code, details = await code_of(asyncio.wait_for(drain(), 5))
    assert code is grpc.StatusCode.ABORTED
    assert details.startswith(f"llm/so-1: replaced by a newer {kind} for the same trigger")
    assert service.streams.count(kind) == 2
    assert service.streams.replaced == 1
    if kind == "StreamIsActive":  # the newer one keeps being pushed
        fleet.update_node("node-a", [workload_pod(1, util=0.0)])
        assert (await asyncio.wait_for(new.read(), 5)).result is False
    assert not other.done()
    new.cancel()
    other.cancel()
    await until(lambda: len(service.streams) == 0, 10.0, "both places freed")


async def test_past_the_memory_budget_a_new_trigger_is_refused_and_a_replacement_is_not(
        fleet: FleetView) -> None:
    fleet.update_node("node-a", [workload_pod(i) for i in range(4)])
    book = StreamBook(budget_bytes=3 * 1000, stream_bytes=900)
    _service, server, channel = await serve(fleet, book)
    stub = pb_grpc.ExternalScalerStub(channel)
    try:
        held = [stub.StreamMetricSpec(so(i)) for i in range(3)]
        for s in held:
            await asyncio.wait_for(s.read(), 5)
        code, details = await code_of(stub.StreamIsActive(so(3)).read())
        assert code is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert details.startswith("this scaler holds 3 streams")
        assert "--stream-memory-mib" in details
        again = stub.StreamMetricSpec(so(0))  # the same trigger: takes the old one's place
        await asyncio.wait_for(again.read(), 5)
        got = await stub.GetMetrics(pb.GetMetricsRequest(  # unary calls are not streams
            scaledObjectRef=so(3), metricName="s0-gpuscale-gpu-utilization"), timeout=5)
        assert got.metricValues[0].metricValueFloat == 60.0
        assert (book.refused, book.replaced, len(book)) == (1, 1, 3)
        for s in [*held, again]:
            s.cancel()
    finally:
        await channel.close()
        await server.stop(0.5)


@pytest.mark.parametrize("metadata", [
    {"podSelector": "app=w1"},
    {"podSelector": "app=w1", "profile": "vllm-inference"},
    PLANNER,
], ids=["gpu-utilization", "vllm-inference", "planner"])
async def test_stream_metric_spec_rules_first_message_at_once_and_equal_to_get_metric_spec(
        served: Served, metadata: dict[str, str]) -> None:
    """KEDA's proto states two rules for StreamMetricSpec: the current specs as soon as the
    stream opens (even with no data about the workload yet), and GetMetricSpec equal to the
    latest streamed value. The planner's metric included."""
    _, channel = served
    stub = pb_grpc.ExternalScalerStub(channel)
    ref = pb.ScaledObjectRef(name="so", namespace="llm", scalerMetadata=metadata)
    stream = stub.StreamMetricSpec(ref)
    first = await asyncio.wait_for(stream.read(), 2)  # no fleet data at all
    assert first.metricSpecs
    for _ in range(3):
        assert await stub.GetMetricSpec(ref, timeout=5) == first
    stream.cancel()


@given(st.lists(st.tuples(st.sampled_from(["StreamIsActive", "StreamMetricSpec"]),
                          st.integers(0, 5), st.booleans()), max_size=60))
def test_the_book_counts_what_is_live(ops: list[tuple[str, int, bool]]) -> None:
    """Any order of opens and ends: one live entry per identity, the bytes and counts
    those of the live entries, never past the budget, a replaced stream told why."""
    book = StreamBook(budget_bytes=4 * 1100, stream_bytes=1000)
    live: dict[tuple[str, int], Held] = {}
    for kind, i, end in ops:
        if end and (kind, i) in live:
            book.release(live.pop((kind, i)))
            continue
        try:
            held = book.hold(kind, "ns", f"so-{i}", {"podSelector": f"app={i}"}, "peer")
        except Overloaded:
            assert (kind, i) not in live
            continue
        old = live.get((kind, i))
        if old is not None:
            assert isinstance(old.reason, Superseded)
            book.release(old)  # its own end: frees nothing more
        live[(kind, i)] = held
        assert book.bytes <= book.budget_bytes
    assert len(book) == len(live)
    assert book.bytes == sum(h.size for h in live.values())
    for kind in ("StreamIsActive", "StreamMetricSpec"):
        assert book.count(kind) == sum(1 for k in live if k[0] == kind)



def test_a_stream_replaced_before_it_waits_is_ended_when_it_starts_waiting() -> None:
    """The place is taken before the stream starts waiting for its first answer; a newer
    stream arriving in between must still end it, not leave it open unseen."""
    book = StreamBook()
    old = book.hold("StreamIsActive", "ns", "so", {"podSelector": "app=a"}, "peer-1")
    book.hold("StreamIsActive", "ns", "so", {"podSelector": "app=a"}, "peer-2")
    ended: list[Exception] = []
    old.watch(ended.append)
    assert len(ended) == 1
    assert isinstance(ended[0], Superseded)
    assert "(from peer-2)" in str(ended[0])
