"""StreamIsActive for many streams at once: one loop decides, the streams only send.

A stream used to wake on every fleet update and decide for itself: with 1,000 agents at
1 Hz that is a thousand wake-ups a second per stream, and 2,000 streams took a whole core
and pushed GetMetrics' p99 past 10 s (BENCHMARKS.md, many streams). Here one loop
(``ActivityPushes``) decides for every open stream in rounds: a round runs when the fleet
view changed (at most every ``min_period``) or a second has passed (for re-sends and the
unavailable grace), goes through the streams with a turn of the event loop every ``chunk``
streams or half a millisecond, whichever comes first (so GetMetrics answers in between),
decides once per distinct trigger (many streams on one ScaledObject share it), and then
rests four times as long as the round took (``duty``: streams get at most a fifth of the
scaler's time). A stream is woken only when it has something to send: a changed state, a
re-send due, or its end. Streams opened together (KEDA re-opening all after a restart)
re-send at spread times, not in one round.

The rules are those the streams had: push when the state changes and at least every
``resend_s``; when the state cannot be known for ``grace_s``, end the stream with the
reason (UNAVAILABLE), so a pushed answer never stands for a state nobody knows.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Hashable
from contextlib import suppress
from dataclasses import dataclass, field

from gpuscale.common.errors import DataUnavailable

log = logging.getLogger(__name__)

MIN_PERIOD_S = 0.25  # rounds at most this often (adds at most this to a push's delay):
#                     with 1,000 agents the fleet changes all the time and rounds ran back
#                     to back; 0.1 s cost 44 % of a core at 1,000 push ScaledObjects with
#                     per-call p99 6.4 ms, 0.25 s 34 % and 4.4 ms, the push still within
#                     0.85 s of a load step at p99 (bench_keda, bench_scaler --trials 20)
IDLE_ROUND_S = 1.0  # a round at least this often (re-sends, the grace for unknown states;
#                     more often when they are shorter)
CHUNK = 10  # streams decided between two turns of the event loop, at most
SLICE_S = 0.0005  # and at most this long: a unary call takes several turns of the loop,
#                   and 50 streams between turns put its p99 at 13.5-13.8 ms at 1,000
#                   streams; 10, 6.7-9.0 ms (bench_keda, one run each)
DUTY = 0.2  # the share of the scaler's time rounds may take when streams are many: at
#            10,000 streams a round takes ~80 ms, so pushes wait up to ~0.4 s more, and
#            the rest of the core answers KEDA's calls (0.5 saturated it, bench_keda)

Check = Callable[[], bool]  # raises DataUnavailable


@dataclass(eq=False)
class Subscription:
    """One open stream: what it asks (``key`` for sharing decisions, ``check`` to decide)
    and what it has to send."""

    key: Hashable
    check: Check
    last: bool | None = None
    since: float = 0.0
    unknown_since: float | None = None
    outbox: bool | None = None  # the state to send next (latest wins)
    failure: Exception | None = None
    done: bool = False
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    def decide(self, decision: bool | Exception, now: float, resend_s: float,
               grace_s: float) -> None:
        if isinstance(decision, Exception) and not isinstance(decision, DataUnavailable):
            self.end(decision)  # bad input or a bug: end it now
            return
        if isinstance(decision, DataUnavailable):
            if self.unknown_since is None:
                self.unknown_since = now
            if now - self.unknown_since >= grace_s:
                self.end(decision)
            return
        self.unknown_since = None
        if decision != self.last or now - self.since >= resend_s:
            first = self.last is None
            self.outbox, self.last, self.since = decision, decision, now
            if first:  # streams opened together (KEDA after a restart) re-send apart
                self.since -= random.uniform(0.0, resend_s / 2)
            self.wake.set()

    def end(self, error: Exception) -> None:
        """End the stream now with ``error`` (past the grace, a bug, or a newer stream
        that replaced it)."""
        self.failure, self.done = error, True
        self.wake.set()

    async def next(self) -> bool | None:
        """The next state to send; None when the stream should end normally. Raises what
        ended it (DataUnavailable past the grace; any other error at once)."""
        while self.outbox is None and not self.done:
            self.wake.clear()
            await self.wake.wait()
        if self.outbox is not None:
            out, self.outbox = self.outbox, None
            return out
        if self.failure is not None:  # a fresh instance per stream: one shared exception
            raise _copy(self.failure) from None  # would gather every stream's traceback
        return None


class ActivityPushes:
    def __init__(self, generation: Callable[[], int], stopping: asyncio.Event,
                 resend_s: float, grace_s: float | Callable[[], float],
                 min_period: float = MIN_PERIOD_S,
                 chunk: int = CHUNK, duty: float = DUTY,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        """``generation``: a number that changes whenever the fleet view does."""
        self._generation = generation
        self._stopping = stopping
        self.resend_s = resend_s
        self._grace = grace_s
        self._min_period, self._chunk, self._duty = min_period, chunk, duty
        self._monotonic = monotonic
        self._subs: dict[int, Subscription] = {}
        self._task: asyncio.Task[None] | None = None
        self.rounds = 0
        self.decisions = 0

    @property
    def grace_s(self) -> float:
        return self._grace() if callable(self._grace) else self._grace

    @grace_s.setter
    def grace_s(self, value: float) -> None:
        self._grace = value

    def __len__(self) -> int:
        return len(self._subs)

    def open(self, key: Hashable, check: Check) -> Subscription:
        """A new stream, decided at once (its first answer does not wait for a round)."""
        sub = Subscription(key, check)
        sub.decide(_decide(check), self._monotonic(), self.resend_s, self.grace_s)
        self._subs[id(sub)] = sub
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._loop())
        return sub

    def close(self, sub: Subscription) -> None:
        self._subs.pop(id(sub), None)

    async def _loop(self) -> None:
        """Rounds while any stream is open; ends with the last one (the next opens it
        again) or when the service stops (every stream then ends normally)."""
        seen, last_round = self._generation(), self._monotonic()
        try:
            await self._rounds(seen, last_round)
        except Exception as exc:  # a bug: every stream ends (INTERNAL), none hangs
            log.exception("StreamIsActive push loop failed")
            for sub in self._subs.values():
                sub.end(exc)
        finally:
            if self._stopping.is_set():
                for sub in self._subs.values():
                    sub.done = True
                    sub.wake.set()

    async def _rounds(self, seen: int, last_round: float) -> None:
        while self._subs and not self._stopping.is_set():
            now = self._monotonic()
            idle = min(IDLE_ROUND_S, self.resend_s, self.grace_s / 2)
            if self._generation() == seen and now - last_round < idle:
                with suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), self._min_period)
                continue
            seen, last_round = self._generation(), now
            await self._round()
            took = self._monotonic() - now
            rest = max(self._min_period - took, took * (1 - self._duty) / self._duty)
            with suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), rest)

    async def _round(self) -> None:
        subs = list(self._subs.values())
        shared: dict[Hashable, bool | Exception] = {}
        now = self._monotonic()
        since_turn, turn_began = 0, time.perf_counter()
        for sub in subs:
            if not (sub.done or id(sub) not in self._subs):
                decision = shared.get(sub.key)
                if decision is None:
                    decision = shared[sub.key] = _decide(sub.check)
                    self.decisions += 1
                sub.decide(decision, now, self.resend_s, self.grace_s)
            since_turn += 1
            if since_turn >= self._chunk or time.perf_counter() - turn_began > SLICE_S:
                await asyncio.sleep(0)
                now = self._monotonic()
                since_turn, turn_began = 0, time.perf_counter()
        await asyncio.sleep(0)
        self.rounds += 1


def _copy(exc: Exception) -> Exception:
    try:
        return type(exc)(str(exc))
    except TypeError:  # an exception class with another signature
        return RuntimeError(str(exc))


def _decide(check: Check) -> bool | Exception:
    try:
        return check()
    except Exception as exc:  # carried to the stream it belongs to, never ends the loop
        return exc
