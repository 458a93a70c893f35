"""The push loop behind StreamIsActive: one decision per trigger per round, streams woken
only with something to send, a broken trigger ending only its own stream. The loop judges
re-sends and the unavailable grace on a clock the tests move by hand, and the tests wait
for rounds by counting them: nothing here depends on how fast the machine is."""

from __future__ import annotations

import asyncio

import pytest

from gpuscale.common.errors import ConfigError, DataUnavailable
from gpuscale.scaler.answers import Answers
from gpuscale.scaler.state.pushes import ActivityPushes, Subscription
from tests.support.clock import Clock
from tests.support.polling import until


class World:
    def __init__(self) -> None:
        self.generation = 0
        self.active = False
        self.unknown = False
        self.checks = 0
        self.stopping = asyncio.Event()
        self.clock = Clock()  # the push loop's clock: re-sends and the grace

    def check(self) -> bool:
        self.checks += 1
        if self.unknown:
            raise DataUnavailable("llm/p-0 (stale: 9.0s old)")
        return self.active

    def pushes(self, **kw: float) -> ActivityPushes:
        return ActivityPushes(lambda: self.generation, self.stopping, resend_s=30.0,
                              grace_s=3.0, monotonic=self.clock, **kw)  # type: ignore[arg-type]


async def first(sub: Subscription, within: float = 10.0) -> bool | None:
    return await asyncio.wait_for(sub.next(), within)


async def rounds_after(pushes: ActivityPushes, seen: int) -> None:
    """Until the loop has finished a round past ``seen`` rounds."""
    await until(lambda: pushes.rounds > seen, what=f"push round {seen + 1}")


async def test_many_streams_on_one_trigger_share_each_decision() -> None:
    world = World()
    pushes = world.pushes(min_period=0.01)
    subs = [pushes.open("so", world.check) for _ in range(500)]
    assert [await first(s) for s in subs] == [False] * 500  # each decided at once
    opened = world.checks
    world.active, world.generation = True, 1
    assert [await first(s) for s in subs] == [True] * 500
    assert world.checks - opened <= 2  # one decision a round, not one a stream
    assert pushes.decisions <= 2
    for s in subs:
        pushes.close(s)


async def test_unchanged_state_wakes_nobody_until_a_resend_is_due() -> None:
    world = World()
    pushes = world.pushes(min_period=0.01)
    sub = pushes.open("so", world.check)
    assert await first(sub) is False
    for g in range(1, 6):  # the fleet changes, the state does not: five rounds decide it
        seen = pushes.rounds
        world.generation = g
        await rounds_after(pushes, seen)
    assert sub.outbox is None
    assert world.checks >= 6
    world.clock.now += pushes.resend_s  # nothing changes but the clock: the re-send is due
    assert await first(sub) is False
    pushes.close(sub)


async def test_unknown_for_the_grace_ends_the_stream_with_the_reason() -> None:
    world = World()
    pushes = world.pushes(min_period=0.01)
    sub = pushes.open("so", world.check)
    assert await first(sub) is False
    world.unknown, world.generation = True, 1
    await until(lambda: sub.unknown_since is not None, what="the unknown state decided")
    assert not sub.done
    world.clock.now += pushes.grace_s
    with pytest.raises(DataUnavailable, match="stale"):
        await first(sub)
    pushes.close(sub)


async def test_unknown_for_less_than_the_grace_does_not_end_the_stream() -> None:
    world = World()
    pushes = world.pushes(min_period=0.01)
    sub = pushes.open("so", world.check)
    assert await first(sub) is False
    world.unknown, world.generation = True, 1
    await until(lambda: sub.unknown_since is not None, what="the unknown state decided")
    world.clock.now += pushes.grace_s - 0.5  # unknown, within the grace ...
    await rounds_after(pushes, pushes.rounds)  # ... as a round past the clock's move judges
    assert not sub.done
    world.unknown, world.active, world.generation = False, True, 2
    assert await first(sub) is True
    assert not sub.done
    pushes.close(sub)


async def test_a_broken_trigger_ends_its_stream_only() -> None:
    world = World()
    pushes = world.pushes(min_period=0.01)

    def broken() -> bool:
        raise ConfigError("demandSource: gone")

    bad = pushes.open("bad", broken)
    good = pushes.open("so", world.check)
    with pytest.raises(ConfigError, match="gone"):
        await first(bad)
    assert await first(good) is False
    world.active, world.generation = True, 1
    assert await first(good) is True
    pushes.close(bad)
    pushes.close(good)


async def test_stopping_ends_every_stream_normally() -> None:
    world = World()
    pushes = world.pushes(min_period=0.01)
    subs = [pushes.open(f"so{i}", world.check) for i in range(3)]
    for s in subs:
        assert await first(s) is False
    world.stopping.set()
    assert [await first(s) for s in subs] == [None, None, None]


async def test_rounds_leave_the_event_loop_time() -> None:
    """With many streams a round is cut into chunks with a turn of the loop between them,
    and the loop rests after a round four times as long (duty 0.2)."""
    world = World()
    pushes = world.pushes(min_period=0.001, chunk=10)
    subs = [pushes.open(f"so{i}", world.check) for i in range(200)]
    await asyncio.sleep(0)  # the loop starts, from this generation
    turns = 0

    async def other_work() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(other_work())
    rounds = pushes.rounds
    for g in range(1, 4):
        seen = pushes.rounds
        world.generation = g
        await rounds_after(pushes, seen)
    task.cancel()
    assert pushes.rounds >= rounds + 3
    assert turns >= 20 * (pushes.rounds - rounds)  # 20 chunks a round, a turn after each
    for s in subs:
        pushes.close(s)
    assert len(pushes) == 0


async def test_a_burst_of_thousands_of_streams_is_not_cancelled() -> None:
    """KEDA re-opening every stream at once after a restart: 3,000 StreamMetricSpec calls
    (3,000 triggers) over 10 connections in one burst all open (gRPC's default pending-call
    limits cancelled a third of such a burst)."""
    import grpc

    from gpuscale.proto import externalscaler_pb2 as pb
    from gpuscale.proto import externalscaler_pb2_grpc as pb_grpc
    from gpuscale.scaler.edges.keda import ScalerServer, ScalerService
    from gpuscale.scaler.state.fleet import FleetView

    server = ScalerServer(ScalerService(Answers(FleetView())), host="127.0.0.1", port=0)
    await server.start()
    chans = [grpc.aio.insecure_channel(f"127.0.0.1:{server.port}", options=[("gs.conn", i)])
             for i in range(10)]
    calls = [pb_grpc.ExternalScalerStub(chans[i % 10]).StreamMetricSpec(pb.ScaledObjectRef(
        name=f"w{i}", namespace="ns", scalerMetadata={"podSelector": f"app=w{i}"}))
             for i in range(3000)]
    try:
        first = await asyncio.wait_for(asyncio.gather(*(c.read() for c in calls),
                                                      return_exceptions=True), 60)
        assert [type(f).__name__ for f in first if not isinstance(f, pb.GetMetricSpecResponse)
                ] == []
    finally:
        for c in calls:
            c.cancel()
        for ch in chans:
            await ch.close()
        await server.stop(0.2)
