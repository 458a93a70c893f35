"""The agent end to end in-process: real HTTP on loopback, sampler cadence, readiness."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import aiohttp
import grpc
import pytest
from prometheus_client import CollectorRegistry

from gpuscale.agent.app import STREAM_MAX_REQUEST, Agent, AgentConfig
from gpuscale.agent.http import MAX_CONNECTIONS
from gpuscale.agent.sampler import Sampler
from gpuscale.proto import telemetry_pb2
from gpuscale.proto import telemetry_pb2_grpc as telemetry_grpc
from gpuscale.telemetry.model import BackendState, NodeSnapshot
from gpuscale.telemetry.scenario import load_scenario
from gpuscale.telemetry.simulated_gpus import SimulatedBackend
from tests.support.polling import until


class ScriptedBackend:
    """A backend whose snapshots and pace the test controls: each call takes at least
    ``delay`` seconds, and call k blocks until ``gates[k-1]`` is set (``released`` records
    whether it was, within 5 s)."""

    name = "scripted"

    def __init__(self, delay: float = 0.0, fail: bool = False,
                 state: BackendState = BackendState.OK,
                 gates: Sequence[threading.Event] = ()) -> None:
        self.delay, self.fail, self.state = delay, fail, state
        self.gates = list(gates)
        self.calls = 0
        self.released: list[bool] = []
        self.threads: set[str] = set()

    def sample(self) -> NodeSnapshot:
        self.calls += 1
        self.threads.add(threading.current_thread().name)
        if self.delay:
            time.sleep(self.delay)
        if self.calls <= len(self.gates):
            self.released.append(self.gates[self.calls - 1].wait(5))
        if self.fail:
            raise RuntimeError("bug in backend")
        return NodeSnapshot(node="n", backend=self.name, taken_at=time.time(),
                            monotonic=time.monotonic(), state=self.state,
                            reason="" if self.state is BackendState.OK else "driver gone")

    def close(self) -> None:
        pass


async def start(agent: Agent) -> tuple[asyncio.Task[None], int]:
    bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(agent.run(bound.set_result))
    return task, await asyncio.wait_for(bound, 5)


@pytest.fixture
async def sim_agent() -> AsyncIterator[tuple[Agent, int]]:
    backend = SimulatedBackend(load_scenario("timesliced-node").nodes[0])
    agent = Agent(backend, AgentConfig(host="127.0.0.1", port=0, interval=0.2,
                                       hostname="node-x"))
    task, port = await start(agent)
    yield agent, port
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_metrics_health_and_ready(sim_agent: tuple[Agent, int]) -> None:
    agent, port = sim_agent
    await agent.sampler.wait_for(2)
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{port}/metrics") as r:
            assert r.status == 200
            assert r.headers["Content-Type"].startswith("text/plain; version=")
            body = await r.text()
        assert 'DCGM_FI_DEV_GPU_UTIL{Hostname="node-x"' in body
        assert "gpuscale_agent_sample_duration_seconds_count" in body
        assert "_created" not in body
        async with http.get(f"http://127.0.0.1:{port}/healthz") as r:
            assert (r.status, await r.text()) == (200, "ok\n")
        async with http.get(f"http://127.0.0.1:{port}/readyz") as r:
            assert r.status == 200
            assert (await r.text()).startswith("ok: 4 GPUs")


async def test_hostile_requests_get_clear_errors_and_the_server_keeps_serving(
        sim_agent: tuple[Agent, int]) -> None:
    _, port = sim_agent
    async with aiohttp.ClientSession() as http:
        async with http.post(f"http://127.0.0.1:{port}/metrics", data=b"x" * 10_000) as r:
            assert r.status in (405, 413)
        async with http.get(f"http://127.0.0.1:{port}/nope") as r:
            assert r.status == 404
    # Oversized header: rejected, not buffered.
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n")
    await writer.drain()
    status = await asyncio.wait_for(reader.readline(), 5)
    assert status.split()[1] in (b"400", b"431")
    writer.close()
    # Garbage and a slow client that never finishes its request line.
    _, junk = await asyncio.open_connection("127.0.0.1", port)
    junk.write(b"\x16\x03\x01\x00\xff garbage\r\n\r\n")
    _, slow = await asyncio.open_connection("127.0.0.1", port)
    slow.write(b"GET /metr")
    await asyncio.gather(junk.drain(), slow.drain())
    async with aiohttp.ClientSession() as http, http.get(
            f"http://127.0.0.1:{port}/healthz") as r:
        assert r.status == 200
    for w in (junk, slow):
        w.close()


async def test_connections_over_the_limit_are_closed_and_the_server_recovers(
        sim_agent: tuple[Agent, int]) -> None:
    """MAX_CONNECTIONS clients that never finish their request hold every slot: one more
    connection is closed unanswered (no thread, no buffer for it); when they go, the
    server answers again."""
    _, port = sim_agent
    held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(MAX_CONNECTIONS)]
    for _, w in held:
        w.write(b"GET /metr")
        await w.drain()
    # Accepted in the order they connected: these 16 first.
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /healthz HTTP/1.0\r\n\r\n")
    await writer.drain()
    with contextlib.suppress(ConnectionResetError):  # closed with our request unread
        assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    for _, w in held:
        w.close()

    async def healthz() -> bool:
        async with aiohttp.ClientSession() as http, http.get(
                f"http://127.0.0.1:{port}/healthz") as r:
            return r.status == 200
    assert await until(healthz, 5.0, "/healthz after the slow clients left",
                       tolerate=(aiohttp.ClientError,))


async def test_not_ready_until_first_sample_and_when_backend_unavailable() -> None:
    first = threading.Event()  # the first sample lasts until the test lets it end
    backend = ScriptedBackend(state=BackendState.UNAVAILABLE, gates=[first])
    agent = Agent(backend, AgentConfig(host="127.0.0.1", port=0, interval=1.0))
    task, port = await start(agent)
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/readyz") as r:
                assert (r.status, await r.text()) == (503, "no sample has completed yet\n")
            first.set()
            await asyncio.wait_for(agent.sampler.wait_for(1), 10)
            assert backend.released == [True]
            async with http.get(f"http://127.0.0.1:{port}/readyz") as r:
                assert r.status == 503
                assert "unavailable: driver gone" in await r.text()
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_readiness_turns_false_when_the_snapshot_goes_stale() -> None:
    clock = [1000.0]
    registry = CollectorRegistry()
    sampler = Sampler(ScriptedBackend(), 1.0, registry, monotonic=lambda: clock[0])
    snap = await sampler.sample_once()
    clock[0] = snap.monotonic + 1.0
    assert sampler.readiness()[0]
    clock[0] = snap.monotonic + 10.0
    ok, why = sampler.readiness()
    assert not ok
    assert "old" in why


async def test_backend_runs_off_the_event_loop_in_one_thread() -> None:
    # Each call blocks until the test opens its gate, which the test can only do if the
    # event loop keeps turning while the call blocks: on the loop's own thread the call
    # would wait out its 5 s alone and record that it was never released.
    gates = [threading.Event() for _ in range(3)]
    backend = ScriptedBackend(gates=gates)
    sampler = Sampler(backend, 0.2, CollectorRegistry())

    def started(n: int) -> bool:
        return backend.calls >= n

    task = asyncio.create_task(sampler.run())
    for n, gate in enumerate(gates, 1):
        await until(functools.partial(started, n), what=f"backend call {n} under way")
        gate.set()
    await asyncio.wait_for(sampler.wait_for(3), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert backend.released == [True, True, True]
    assert len(backend.threads) == 1
    assert next(iter(backend.threads)).startswith("gpu-sampler")


async def test_overrunning_sample_skips_ticks_and_a_raising_backend_is_survived() -> None:
    registry = CollectorRegistry()
    slow = ScriptedBackend(delay=0.5)
    sampler = Sampler(slow, 0.2, registry)

    def count(name: str) -> int:
        return int(registry.get_sample_value(name) or 0)

    def accounted() -> tuple[int, int, int]:
        """(published, failed, skipped), read at one instant on the event loop: the
        sampler is between calls or awaiting one, every finished call accounted for."""
        seq = sampler.latest.seq if sampler.latest is not None else 0
        return (seq, count("gpuscale_agent_sample_failures_total"),
                count("gpuscale_agent_ticks_skipped_total"))

    task = asyncio.create_task(sampler.run())
    await asyncio.wait_for(sampler.wait_for(3), 10)
    slow.fail = True
    await until(lambda: accounted()[1] >= 2, what="two failed samples after the good ones")
    seq, failed, skipped = accounted()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seq == 3  # failures publish nothing: the last good one ages
    # Every call, good or failed, took at least 0.5 s, overrunning its 0.2 s tick by at
    # least 0.3 s: each skips at least the two ticks it covered (a ratio, not a duration).
    assert skipped >= 2 * (seq + failed)


def test_interval_below_200ms_is_refused() -> None:
    with pytest.raises(ValueError, match=r"at least 0\.2"):
        Sampler(ScriptedBackend(), 0.1, CollectorRegistry())


def test_scenario_path_is_used(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("nodes: [{name: a, gpus: [{model: T4}]}]\n")
    snap = SimulatedBackend(load_scenario(path).nodes[0]).sample()
    assert [g.name for g in snap.gpus] == ["Tesla T4"]


async def test_the_stream_refuses_an_oversized_subscribe_and_serves_on() -> None:
    """A SubscribeRequest past STREAM_MAX_REQUEST is RESOURCE_EXHAUSTED from gRPC itself
    (each open stream would otherwise hold what its request carried); a subscriber with
    a name gets its updates on the same connection afterwards."""
    node = load_scenario("timesliced-node").nodes[0]
    agent = Agent(SimulatedBackend(node), AgentConfig(host="127.0.0.1", port=0, interval=0.2,
                                                      hostname="node-x", stream_port=0))
    task, _ = await start(agent)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{agent.stream_port}") as channel:
            stub = telemetry_grpc.AgentTelemetryStub(channel)
            for _ in range(20):
                call = stub.Subscribe(telemetry_pb2.SubscribeRequest(
                    subscriber="s" * (STREAM_MAX_REQUEST + 1)))
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call.read()
                assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            good = stub.Subscribe(telemetry_pb2.SubscribeRequest(subscriber="scaler"))
            update = await asyncio.wait_for(good.read(), 10)
            assert update.node == node.name
            good.cancel()
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
