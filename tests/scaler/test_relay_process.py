"""The front as a child process (``gpuscale scaler --answer-process``): the scaler starts it
and serves KEDA and Inspect through it, ends when it dies, counts a stream's memory in both
processes and says a taken port; the fleet process pings it - a wedged front is killed, a
late one is not - and the front answers from its own loop."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
import pytest

from gpuscale.proto import externalscaler_pb2 as pb
from gpuscale.proto import externalscaler_pb2_grpc as pb_grpc
from gpuscale.proto import inspect_pb2, inspect_pb2_grpc
from gpuscale.scaler.answers import Answers
from gpuscale.scaler.config import ScalerConfig
from gpuscale.scaler.edges import relay
from gpuscale.scaler.edges.keda import ScalerService
from gpuscale.scaler.edges.keda import add_to_server as add_keda
from gpuscale.scaler.edges.relay import PING, PONG, FrontStats, frame, read_frame
from gpuscale.scaler.edges.relay_backend import RelayBackend
from gpuscale.scaler.edges.relay_front import RelayFront
from gpuscale.scaler.edges.relay_supervisor import Front
from gpuscale.scaler.root import Scaler
from gpuscale.scaler.state.fleet import FleetView
from tests.scaler.relay_calls import REF, rec
from tests.support.polling import until


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
