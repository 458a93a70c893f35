"""KEDA's port in a child process (``gpuscale scaler --answer-process``, scaler.edges.relay):
the front relays each call to the fleet process over a private unix socket. The contract
itself runs through the front in test_keda_service (its ``stub`` fixture); here what only
the relay can get wrong: cancellation, a stream replaced by a newer one, the fleet process
going away, hostile frames on the socket, and the scaler's own start-up and stop."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuscale.proto import externalscaler_pb2 as pb
from gpuscale.proto import externalscaler_pb2_grpc as pb_grpc
from gpuscale.proto import inspect_pb2, inspect_pb2_grpc
from gpuscale.scaler.answers import Answers
from gpuscale.scaler.config import ScalerConfig
from gpuscale.scaler.edges import relay
from gpuscale.scaler.edges.keda import ScalerService
from gpuscale.scaler.edges.keda import add_to_server as add_keda
from gpuscale.scaler.edges.relay import (
    CANCEL,
    END,
    HEADER,
    MAX_FRAME,
    MSG,
    PING,
    PONG,
    REQ,
    FrontStats,
    frame,
    parse_request,
    parse_status,
    read_frame,
    request,
)
from gpuscale.scaler.edges.relay_backend import RelayBackend
from gpuscale.scaler.edges.relay_front import RelayFront
from gpuscale.scaler.edges.relay_supervisor import Front
from gpuscale.scaler.root import Scaler
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.stream.records import PodRecord
from tests.support.polling import until
from tests.support.relay import relayed


def rec(name: str, util: float, at: float = 1000.0) -> PodRecord:
    return PodRecord("llm", name, "node-a", {"app": "vllm"}, None, True,
                     {"gpu-utilization": util}, at)


REF = pb.ScaledObjectRef(name="so", namespace="llm", scalerMetadata={"podSelector": "app=vllm"})


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


async def _backend_pair(fleet: FleetView) -> tuple[asyncio.StreamReader,
                                                   asyncio.StreamWriter, asyncio.Task[None]]:
    """A raw connection to the fleet process's side, as a (possibly hostile) front."""
    backend = RelayBackend([lambda s: add_keda(ScalerService(Answers(fleet)), s)])
    ours, theirs = socket.socketpair()
    reader, writer = await asyncio.open_unix_connection(sock=ours, limit=MAX_FRAME)
    r2, w2 = await asyncio.open_unix_connection(sock=theirs, limit=MAX_FRAME)
    return reader, writer, asyncio.get_running_loop().create_task(backend.serve(r2, w2))


async def test_hostile_frames_get_a_status_or_end_the_connection(fleet: FleetView) -> None:
    reader, writer, serving = await _backend_pair(fleet)
    fleet.update_node("node-a", [rec("v-0", 42.0)])
    method = "/externalscaler.ExternalScaler/GetMetrics"
    body = pb.GetMetricsRequest(scaledObjectRef=REF,
                                metricName="gpuscale-gpu-utilization").SerializeToString()
    cases = {
        1: frame(REQ, 1, request(method, "peer", body)),  # a good one
        2: frame(REQ, 2, b"\x00\x05ab"),  # truncated
        3: frame(REQ, 3, request("/nope.Nope/Nothing", "peer", b"")),
        4: frame(REQ, 4, request(method, "peer", b"\xff\xff\xff")),  # not protobuf
        5: frame(REQ, 5, b"\x00\x02\xc3\x28\x00\x00"),  # not UTF-8
    }
    for raw in cases.values():
        writer.write(raw)
    writer.write(frame(CANCEL, 99))  # a call that does not exist: ignored
    ends: dict[int, tuple[grpc.StatusCode, str]] = {}
    got: dict[int, bytes] = {}
    while len(ends) < len(cases):
        kind, call, payload = await asyncio.wait_for(read_frame(reader), 5)
        if kind == MSG:
            got[call] = payload
        elif kind == END:
            ends[call] = parse_status(payload)
    assert ends[1][0] is grpc.StatusCode.OK
    assert pb.GetMetricsResponse.FromString(got[1]).metricValues[0].metricValueFloat == 42.0
    assert ends[2] == (grpc.StatusCode.INTERNAL, "truncated request frame")
    assert ends[3][0] is grpc.StatusCode.UNIMPLEMENTED
    assert ends[4] == (grpc.StatusCode.INTERNAL, "Exception deserializing request!")
    assert ends[5][0] is grpc.StatusCode.INTERNAL
    # A frame past the limit ends the connection (and every call on it), nothing else.
    writer.write(HEADER.pack(MAX_FRAME + 1, REQ, 6))
    await asyncio.wait_for(serving, 5)
    assert await reader.read() == b""
    writer.close()


@given(st.binary(max_size=300))
def test_request_frames_parse_or_say_why(payload: bytes) -> None:
    try:
        method, peer, body = parse_request(payload)
    except (ValueError, UnicodeDecodeError):
        return
    assert request(method, peer, body) == payload


@given(st.text(max_size=60), st.text(max_size=60), st.binary(max_size=100))
def test_request_frames_round_trip(method: str, peer: str, body: bytes) -> None:
    assert parse_request(request(method, peer, body)) == (method, peer[:1000], body)


async def test_the_scaler_with_an_answer_process_serves_keda_and_inspect() -> None:
    scaler = Scaler(ScalerConfig(host="127.0.0.1", port=0, metrics_port=None,
                                 in_process=True, answer_process=True))
    ports: list[int] = []
    task = asyncio.get_running_loop().create_task(scaler.run(ports.append))
    await until(lambda: ports or task.done(), within=30, what="the front listening")
    assert ports == [scaler.port]
    assert scaler.server is None
    scaler.fleet.update_node("node-a", [rec("v-0", 70.0, at=scaler.fleet.now())])
    async with grpc.aio.insecure_channel(f"127.0.0.1:{ports[0]}") as channel:
        stub = pb_grpc.ExternalScalerStub(channel)
        got = await stub.GetMetrics(pb.GetMetricsRequest(
            scaledObjectRef=REF, metricName="gpuscale-gpu-utilization"))
        assert got.metricValues[0].metricValueFloat == 70.0
        stream = stub.StreamIsActive(REF)
        assert (await asyncio.wait_for(stream.read(), 5)).result is True
        inspect = inspect_pb2_grpc.InspectStub(channel)
        seen = await inspect.Fleet(inspect_pb2.FleetRequest())
        assert [p.name for p in seen.pods] == ["v-0"]
        task.cancel()  # SIGTERM: the stream ends cleanly, the front stops
        assert await asyncio.wait_for(stream.read(), 10) is grpc.aio.EOF
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_the_scaler_ends_when_its_front_dies() -> None:
    scaler = Scaler(ScalerConfig(host="127.0.0.1", port=0, metrics_port=None,
                                 in_process=True, answer_process=True))
    ports: list[int] = []
    task = asyncio.get_running_loop().create_task(scaler.run(ports.append))
    await until(lambda: ports or task.done(), within=30, what="the front listening")
    assert scaler.front is not None
    assert scaler.front._proc is not None
    scaler.front._proc.kill()
    with pytest.raises(ExceptionGroup) as err:
        await asyncio.wait_for(task, 15)
    assert "gRPC front exited with -9" in str(err.value.exceptions[0])


async def test_the_stream_budget_counts_both_processes() -> None:
    """With the answer process a stream costs memory in both processes: the same budget
    admits fewer streams (in process: budget // STREAM_BYTES), so the container stays
    inside its limit."""
    from gpuscale.scaler.state.streams import RELAYED_STREAM_BYTES, STREAM_BYTES

    scaler = Scaler(ScalerConfig(in_process=True, metrics_port=None, port=0,
                                 host="127.0.0.1", stream_memory_mib=256,
                                 answer_process=True))
    assert scaler.service.streams.max_streams() == 256 * 2**20 // RELAYED_STREAM_BYTES
    assert RELAYED_STREAM_BYTES > STREAM_BYTES


async def test_a_taken_port_is_cannot_listen() -> None:
    with socket.socket(socket.AF_INET) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        scaler = Scaler(ScalerConfig(host="127.0.0.1", port=port, metrics_port=None,
                                     in_process=True, answer_process=True))
        with pytest.raises(OSError, match=f"127.0.0.1:{port}"):
            await scaler.run()


def test_status_frames_never_raise() -> None:
    assert parse_status(b"")[0] is grpc.StatusCode.INTERNAL
    assert parse_status(struct.pack("!B", 250) + b"x") == (grpc.StatusCode.UNKNOWN, "x")


@asynccontextmanager
async def _watched(heartbeat_s: float) -> AsyncIterator[tuple[Front, asyncio.Task[None]]]:
    """A real front (a child process) whose fleet process watches it as the scaler does,
    pinging every ``heartbeat_s`` with a 1.5 s limit, once its first PONG has come back;
    stopped on the way out."""
    service = ScalerService(Answers(FleetView()))
    front = Front(RelayBackend([lambda s: add_keda(service, s)]), heartbeat_s=heartbeat_s,
                  wedged_s=1.5)
    await front.start("127.0.0.1:0", None, [])
    watch = asyncio.get_running_loop().create_task(front.watch())
    try:
        await until(lambda: front.backend.stats is not None, within=10, what="a PONG")
        assert front._proc is not None
        yield front, watch
    finally:
        watch.cancel()
        await front.stop(service.stopping)


async def test_a_wedged_front_is_killed_and_its_figures_were_on_metrics() -> None:
    """The front answers the fleet process's pings with its CPU, memory and collections
    (on the scaler's /metrics); stopped with SIGSTOP - alive, its loop stuck, KEDA's port
    still open - it is killed once silent past ``wedged_s``, and the scaler then ends.
    The silence on /metrics then covers at least those rounds (a bound the rounds make,
    whatever the machine's speed)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from gpuscale.scaler.edges.http import FrontCollector

    async with _watched(0.1) as (front, watch):
        registry = CollectorRegistry()
        registry.register(FrontCollector(front))

        def scrape() -> dict[str, float]:
            return {s.name + str(s.labels.get("generation", "")): s.value
                    for f in text_string_to_metric_families(
                        generate_latest(registry).decode()) for s in f.samples}

        samples = scrape()
        assert samples["gpuscale_front_cpu_seconds_total"] > 0
        assert samples["gpuscale_front_resident_memory_bytes"] > 10 * 2**20
        assert samples["gpuscale_front_gc_collections_total0"] >= 0
        assert samples["gpuscale_front_silent_seconds"] >= 0
        assert front._proc is not None
        os.kill(front._proc.pid, signal.SIGSTOP)
        with pytest.raises(RuntimeError, match="did not answer for"):
            await asyncio.wait_for(watch, 10)
        assert front._proc.returncode == -signal.SIGKILL
        # wedged_s / heartbeat_s rounds in a row, each waited in full, with no answer
        assert scrape()["gpuscale_front_silent_seconds"] >= front.wedged_s - 0.01


async def test_a_pong_is_recorded_and_one_that_is_not_ends_the_connection(
        fleet: FleetView) -> None:
    backend = RelayBackend([lambda s: add_keda(ScalerService(Answers(fleet)), s)])
    ours, theirs = socket.socketpair()
    reader, writer = await asyncio.open_unix_connection(sock=ours)
    r2, w2 = await asyncio.open_unix_connection(sock=theirs)
    serving = asyncio.get_running_loop().create_task(backend.serve(r2, w2))
    writer.write(frame(PONG, 41, FrontStats(1.5, 2**30, (3, 2, 1)).pack()))
    await until(lambda: backend.answered_seq == 41, within=5, what="the PONG")
    assert backend.stats == FrontStats(1.5, 2**30, (3, 2, 1))
    writer.write(frame(PONG, 42, FrontStats(float("nan"), 1, (0, 0, 0)).pack()))
    await asyncio.wait_for(serving, 5)
    assert await reader.read() == b""
    assert backend.answered_seq == 41
    writer.close()


@given(st.one_of(st.binary(max_size=64), st.binary(min_size=32, max_size=32)))
def test_pong_payloads_parse_or_say_why(payload: bytes) -> None:
    try:
        stats = FrontStats.unpack(payload)
    except ValueError:
        return
    assert stats.pack() == payload
    assert stats.cpu_s >= 0


async def test_a_front_that_answers_late_is_not_killed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A busy front may answer a ping rounds late: any answer in a round counts. Here a
    front stopped (SIGSTOP) while 3 pings go out, under a limit of 7.5 rounds (1.5 s of
    0.2 s rounds), then resumed: it answers those pings, and lives on for more rounds than
    the limit. Rounds are counted (the pings sent), not timed."""
    async with _watched(0.2) as (front, watch):
        assert front._proc is not None
        sent: list[int] = []
        ping = front.backend.ping

        def counted(seq: int) -> None:
            sent.append(seq)
            ping(seq)

        monkeypatch.setattr(front.backend, "ping", counted)
        await until(lambda: sent, what="a ping counted")
        os.kill(front._proc.pid, signal.SIGSTOP)
        stopped_after = len(sent)
        await until(lambda: len(sent) >= stopped_after + 3, what="3 pings to a stopped front")
        os.kill(front._proc.pid, signal.SIGCONT)
        first_late = sent[stopped_after]  # the first ping sent while it was stopped
        await until(lambda: front.backend.answered_seq >= first_late, what="a late answer")
        resumed_after = len(sent)
        await until(lambda: len(sent) >= resumed_after + 10, within=30, what="10 rounds")
        assert not watch.done()
        assert front.backend.answered_seq >= sent[resumed_after]  # answering, round by round


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


async def test_the_front_answers_a_ping_from_its_own_loop() -> None:
    ours, theirs = socket.socketpair()
    reader, writer = await asyncio.open_unix_connection(sock=ours)
    front = RelayFront(reader, writer)
    pump = asyncio.get_running_loop().create_task(front.pump())
    fleet_reader, fleet_writer = await asyncio.open_unix_connection(sock=theirs)
    front._streams[7] = relay._Inbox()  # a call of the same number: a ping is not its
    fleet_writer.write(frame(PING, 7))
    kind, seq, payload = await asyncio.wait_for(read_frame(fleet_reader), 5)
    assert (kind, seq) == (PONG, 7)
    assert FrontStats.unpack(payload).rss_bytes > 0
    fleet_writer.close()
    await asyncio.wait_for(pump, 5)
