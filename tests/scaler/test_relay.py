"""KEDA's port in a child process (``gpuscale scaler --answer-process``, scaler.edges.relay):
the front relays each call to the fleet process over a private unix socket. The contract
itself runs through the front in test_keda_service (its ``stub`` fixture); here what only
the relay can get wrong: cancellation, a stream replaced by a newer one, the fleet process
going away, replies past the limit, call ids, whole-state streams. Its frames on the socket:
test_relay_frames; the front as a process, started, watched and stopped: test_relay_process."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import grpc
import pytest

from gpuscale.proto import externalscaler_pb2 as pb
from gpuscale.proto import externalscaler_pb2_grpc as pb_grpc
from gpuscale.scaler.answers import Answers
from gpuscale.scaler.edges import relay
from gpuscale.scaler.edges.keda import ScalerService
from gpuscale.scaler.edges.relay import END, MSG, frame, read_frame
from gpuscale.scaler.edges.relay_front import RelayFront
from gpuscale.scaler.edges.relay_supervisor import Front
from gpuscale.scaler.state.fleet import FleetView
from tests.scaler.relay_calls import REF, rec
from tests.support.polling import until
from tests.support.relay import relayed

Served = tuple[ScalerService, pb_grpc.ExternalScalerStub, Front]


@pytest.fixture
async def served(fleet: FleetView) -> AsyncIterator[Served]:
    """A service in this process (the fleet process) behind a real front, and a client."""
    service = ScalerService(Answers(fleet))
    async with relayed(service) as front, \
            grpc.aio.insecure_channel(f"127.0.0.1:{front.port}") as channel:
        yield service, pb_grpc.ExternalScalerStub(channel), front


async def test_a_cancelled_stream_gives_its_place_back(served: Served,
                                                      fleet: FleetView) -> None:
    service, stub, _ = served
    fleet.update_node("node-a", [rec("v-0", 0.0)])
    stream = stub.StreamIsActive(REF)
    assert (await asyncio.wait_for(stream.read(), 5)).result is False
    assert len(service.pushes) == 1
    assert len(service.streams) == 1
    stream.cancel()  # KEDA dropped it: the fleet process must let go too
    await until(lambda: len(service.pushes) == 0 and len(service.streams) == 0,
                what="the stream released in the fleet process")


async def test_a_newer_stream_replaces_the_older_through_the_front(served: Served,
                                                                   fleet: FleetView) -> None:
    _, stub, _ = served
    fleet.update_node("node-a", [rec("v-0", 50.0)])
    old = stub.StreamIsActive(REF)
    assert (await asyncio.wait_for(old.read(), 5)).result is True
    new = stub.StreamIsActive(REF)
    assert (await asyncio.wait_for(new.read(), 5)).result is True
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await asyncio.wait_for(old.read(), 5)
    assert err.value.code() is grpc.StatusCode.ABORTED
    assert "replaced" in (err.value.details() or "")
    new.cancel()


async def test_many_streams_and_unary_calls_on_one_connection(served: Served,
                                                              fleet: FleetView) -> None:
    service, stub, _ = served
    fleet.update_node("node-a", [rec("v-0", 50.0)])
    refs = [pb.ScaledObjectRef(name=f"so-{i}", namespace="llm",
                               scalerMetadata={"podSelector": "app=vllm"}) for i in range(300)]
    streams = [stub.StreamIsActive(r) for r in refs] + [stub.StreamMetricSpec(r)
                                                       for r in refs]
    firsts = await asyncio.wait_for(asyncio.gather(*(s.read() for s in streams)), 30)
    assert all(f is not grpc.aio.EOF for f in firsts)
    got = await stub.GetMetrics(pb.GetMetricsRequest(
        scaledObjectRef=REF, metricName="gpuscale-gpu-utilization"))
    assert got.metricValues[0].metricValueFloat == 50.0
    assert len(service.streams) == 600
    for s in streams:
        s.cancel()


async def test_when_the_fleet_process_goes_the_front_says_unavailable_and_ends(
        served: Served, fleet: FleetView) -> None:
    _, stub, front = served
    fleet.update_node("node-a", [rec("v-0", 50.0)])
    stream = stub.StreamIsActive(REF)
    assert (await asyncio.wait_for(stream.read(), 5)).result is True
    front.backend.disconnect()  # as when the fleet process dies
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await asyncio.wait_for(stream.read(), 5)
    assert err.value.code() is grpc.StatusCode.UNAVAILABLE
    assert "fleet process is not reachable" in (err.value.details() or "")
    with pytest.raises(RuntimeError, match="gRPC front exited"):
        await asyncio.wait_for(front.watch(), 10)  # the scaler then fails


async def test_a_reply_past_the_limit_ends_that_call_only(
        served: Served, fleet: FleetView, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reply larger than the relay carries (an Inspect Fleet of a huge fleet) ends its
    call RESOURCE_EXHAUSTED; the front and every other call go on."""
    _, stub, front = served
    monkeypatch.setattr(relay, "MAX_REPLY", 2000)  # the fleet process's side
    fleet.update_node("node-a", [rec(f"v-{i}", 50.0) for i in range(100)])
    metrics = pb.GetMetricsRequest(scaledObjectRef=REF, metricName="gpuscale-gpu-utilization")
    stream = stub.StreamIsActive(REF)
    assert (await asyncio.wait_for(stream.read(), 5)).result is True
    monkeypatch.setattr(relay, "MAX_REPLY", 20)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.GetMetrics(metrics)
    assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "the relay carries at most 20" in (err.value.details() or "")
    monkeypatch.setattr(relay, "MAX_REPLY", 2000)
    got = await stub.GetMetrics(metrics)
    assert got.metricValues[0].metricValueFloat == 5000.0
    assert front.backend.connections == 1
    stream.cancel()


async def test_call_ids_wrap_around_and_skip_those_in_use() -> None:
    ours, theirs = socket.socketpair()
    reader, writer = await asyncio.open_unix_connection(sock=ours)
    front = RelayFront(reader, writer)
    front._last_id = relay.ID_SPACE - 3
    front._streams[relay.ID_SPACE - 1] = relay._Inbox()  # a stream open since long ago
    front._streams[1] = relay._Inbox()
    got = [front._next_id() for _ in range(3)]
    assert got == [relay.ID_SPACE - 2, 2, 3]  # never 0, never an id in use
    writer.close()
    theirs.close()


async def test_an_ok_without_a_reply_is_never_an_empty_answer() -> None:
    """The front behind a real gRPC server, and a fleet-process side that misbehaves: an
    END OK with no message before it must not become an empty GetMetricsResponse (KEDA
    would read no value as OK); frames for calls nobody made are ignored."""
    ours, theirs = socket.socketpair()
    reader, writer = await asyncio.open_unix_connection(sock=ours)
    front = RelayFront(reader, writer)
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((front.handler(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    pump = asyncio.get_running_loop().create_task(front.pump())
    fleet_reader, fleet_writer = await asyncio.open_unix_connection(sock=theirs)

    async def misbehave() -> None:
        _, call, _ = await read_frame(fleet_reader)
        fleet_writer.write(frame(MSG, call + 1000, b"x") + frame(END, call + 1000, b"\x00"))
        fleet_writer.write(frame(END, call, b"\x00"))  # OK, and no reply at all

    task = asyncio.get_running_loop().create_task(misbehave())
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await pb_grpc.ExternalScalerStub(channel).GetMetrics(pb.GetMetricsRequest(
                    scaledObjectRef=REF, metricName="gpuscale-gpu-utilization"), timeout=5)
        assert err.value.code() is grpc.StatusCode.INTERNAL
        assert "without a reply" in (err.value.details() or "")
        await task
    finally:
        await server.stop(None)
        pump.cancel()
        fleet_writer.close()


def test_every_relayed_stream_is_a_whole_state_stream() -> None:
    streams = {name for name, streaming in relay.methods().items() if streaming}
    assert streams == relay.WHOLE_STATE_STREAMS


async def test_a_stream_holds_one_untaken_message_not_a_backlog() -> None:
    """Stream messages are whole states: a client that stops reading holds the newest in
    the front, however many the fleet process sends, then the end."""
    inbox = relay._Inbox()
    for i in range(10_000):
        inbox.put(MSG, b"state %d" % i)
    inbox.put(END, b"\x00")
    inbox.put(MSG, b"after the end")  # never delivered
    assert await inbox.get() == (MSG, b"state 9999")
    assert await inbox.get() == (END, b"\x00")
    waiting = relay._Inbox()
    got = asyncio.get_running_loop().create_task(waiting.get())
    await asyncio.sleep(0)
    waiting.put(MSG, b"first")
    assert await asyncio.wait_for(got, 1) == (MSG, b"first")


