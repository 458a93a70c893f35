"""The planner: how many replicas an LLM workload needs ahead of its traffic.

A reactive signal (requests in the server over a per-pod target) pays for every burst with
minutes of missed SLO, because a new replica needs minutes to become Ready. The planner
turns what the engines report every second into a replica count, in units of the work one
replica does in one second (a "replica-second"):

- **Work per second.** A replica that prefills ``prefill_tps`` prompt tokens or decodes
  ``decode_tps`` generated tokens in a second is fully busy, so the work served in a second
  is ``prompt tokens/s / prefill_tps + generation tokens/s / decode_tps`` (from vLLM's
  counters, per pod). Work that *arrived* in that second is what was served plus the growth
  of the waiting queue times the mean work of one request (served work over finished
  requests, over the last minutes); over the steady window, plus the decode of sequences
  that joined the batches, which the served work shows only as it is generated
  (``arrivals``: minutes late for reasoning-length outputs).
- **steady** (Little's law): the mean arrived work over the last minute, plus its growth
  over one start-up (``trend``: a replica asked for now serves the load of a start-up from
  now; a load that has stopped rising for half the window - a step, a ramp that ended -
  is planned without growth), with room: replicas that carry the work in flight with
  room left. The room is the target busy fraction ``utilization``'s (work / utilization)
  up to ``ROOM_POOL`` replicas' worth of work, and beyond grows as the square root of the
  work (a pool's fluctuation does: 32 replicas' work at 0.8 plans 34, not 40).
- **burst**: the smallest service rate that keeps every arrival of the remembered
  history (``memory_s``, at 1-s resolution) within the queueing-delay budget (``delay_s``,
  or a TTFT objective less the prefill of the mean prompt seen, ``delay()``):
  a server of rate c keeps each arrival's wait within D exactly when the work arriving in
  every interval of length L is at most c x (L + D) (the delay bound of a constant-rate
  server). Taken over intervals up to ``BURST_SPANS[-1]`` seconds (longer ones are what
  ``steady`` follows), less the overflow the objective's percentile absorbs:
  ``late_share`` (5 %) of the minute's work may wait late, so a second-scale clump of
  long prompts is no burst (``bursts``). A burst is remembered as two figures: that rate,
  and its **excess** over the level it stood on (the quietest minute of the
  ``BURST_BASE_S`` before it); the term is the smaller of the largest remembered rate and
  the current level (the steady term's mean) plus the largest remembered excess. So a
  workload that bursts keeps its headroom *above its level* for ``memory_s``, and when the
  level itself falls (the evening side of a day), the capacity of the morning's level is
  not held for the memory's 20 minutes. A rate the load keeps for ``LEVEL_S`` (every whole
  minute at least ``LEVEL_SHARE`` of it) is a level, not a burst - a step up, a day's peak:
  it is no excess, and the excess remembered on the way up to it is forgotten (a step that
  lasts 12 minutes no longer holds its height as headroom for 15 more). A workload with no
  arrival for ``QUIET_S`` holds no burst headroom: it has no level to burst from. The
  memory is for bursts that recur (``recurrence``; whole for half of ``memory_s``, then
  fading to nothing, ``bursts.faded``): a first burst is kept one hold; two large bursts
  give a period, and the next one's excess is held from a start-up before it is due (its
  rise then plans no growth).
- **concurrency**: running sequences over ``max_batch`` at ``utilization`` (full batches
  cannot take the next request; waiting ones are the backlog's); **kv**: the Ready pods'
  KV-cache use, plus its growth over one start-up (``trend``: long generations fill the
  cache for minutes while the work per second stays low; read sooner than the load's),
  over ``kv_target`` (a full cache stops the batch from growing).
- **backlog**: the waiting queue's work spread over the start-up, the time a new
  replica needs to become Ready: the extra capacity that drains it by the time it arrives.
- **start-up** (the look-ahead of ``steady`` and ``kv``, the backlog's spread and the
  hold): ``startup_s`` when the trigger gives one; otherwise measured - each Ready pod's
  creation to its first Ready, from the caller's pod watch (``Observation.startups``),
  the newest ``STARTUP_SAMPLES`` pods kept, and their ``STARTUP_QUANTILE`` taken (a
  distribution with a long tail: a node pulling the image; the slow starts are the ones
  a plan must cover) once ``STARTUP_MIN_SAMPLES`` pods have shown one; until then
  ``DEFAULT_STARTUP_S``.
- **capacity**: while requests have waited at a pod for ``SATURATED_S``, it serves all it
  can, so its work is what one replica delivers of the configured capacity (batch or KV
  limits, a slower GPU than configured); learned per pod from the pods that wait (the
  observation's ``pods``; from the sums when a caller has no per-pod loads), slowly and
  only below 1. Before any queue, the **batch capacity** (``learned.batch_capacity``):
  what a replica delivers once its KV cache is full, from the KV each running sequence
  holds and the speed it decodes at in what prefill leaves. The smaller of the two
  divides the work terms. A capacity configured too low only costs GPU-hours; too high
  would plan too few replicas, and these correct it from the engines' own counters.

planned = ceil(max(steady, burst, concurrency, kv, current) + backlog) - ``current``
being the work the Ready pods served over the last ``CURRENT_S`` seconds, so a plan is
never below what runs now - and never below the largest **held** count of the last
``hold_s`` (default: the start-up time; capacity given back that is needed again within a
start-up costs a cold start of missed SLO). The hold keeps the load that is here:
ceil(max(steady and kv without their growth, concurrency)) - not a queue a burst left
(the served work; the running sequences and KV beyond what the arrivals sustain) nor the burst term,
which its own memory keeps (a memory shorter than the hold is held) - and of a load
that falls smoothly, less the fall it has shown since (``scaler.core.hold``). The forecast
growth and the backlog are planned for while they last, not held: a trend that a step in
the load made (the 5-minute slope of a load that jumped and stays flat) is gone once the
step is, and the replicas that drain a queue are not needed once it is drained (measured:
holding them cost 8 % more GPU-hours over the benchmark's loads, for no fewer missed
minutes). Until the planner has seen a whole hold window it never plans below the pods
that exist (it has not seen enough to know they are not needed).

**Draining** (``drain_s``): the plan goes below the Ready pods only as far as cuts at most
``CUT_SHARE`` of the requests they run (``scaler.core.drain``). **Spares**
(``spare_replicas``, 0 unless set): asked on top while a scale-up starts (``hedge``).

The plan is a total, not an increment: pods that are starting are part of it (they are on
their way; the HPA counts them in its current replicas) and are never asked for twice. KEDA's
AverageValue target T makes the HPA compute ceil(value / T): the service answers
``planned x T``. Missing data is never a smaller plan: a Ready pod without its counters
makes the observation unusable (the caller raises UNAVAILABLE), and a planner that has had
no usable observation for ``stale_s`` answers UNAVAILABLE with the last reason.

Pure: no I/O, no clock of its own (the caller passes ``now``). The parts: the values
(``plan_values``), the per-second history (``windows``), the forecast growth and fall
(``trend``), the burst term (``bursts``), the drain floor (``drain``), the start-up and
capacity learned from the pods (``learned``), the decode not yet served (``arrivals``);
this module observes, combines the terms and holds.
"""

from __future__ import annotations

import math

from gpuscale.common.freshness import is_stale
from gpuscale.scaler.core.arrivals import decode_work, joined, per_request
from gpuscale.scaler.core.bursts import BURST_SPANS, Bursts
from gpuscale.scaler.core.drain import CUT_SHARE, Drain
from gpuscale.scaler.core.hedge import spare
from gpuscale.scaler.core.hold import Hold
from gpuscale.scaler.core.learned import BatchSums, Capacity, Startup, batch_capacity, decoding
from gpuscale.scaler.core.plan_values import (
    DEFAULT_STARTUP_S,
    Observation,
    Plan,
    PlannerConfig,
    PlanUnavailable,
    PodLoad,
)
from gpuscale.scaler.core.trend import TREND_S, fall, kv_growth, load_growth
from gpuscale.scaler.core.windows import BASE_BLOCK_S, Window

# The values are imported from here by the planner's callers.
__all__ = ["CUT_SHARE", "DEFAULT_STARTUP_S", "Observation", "Plan", "PlanUnavailable",
           "Planner", "PlannerConfig", "PodLoad"]

STEADY_S = 60  # the window of the steady term
REQUEST_MEMORY_S = 300  # the window of the mean work of one request
QUIET_S = TREND_S  # no arrival this long: the burst term holds nothing (it may go to zero)
MAX_GAP_S = 30  # a longer gap between observations restarts the arrival history
CURRENT_S = 10  # the window of the current term
DEFAULTS = PlannerConfig()


ROOM_POOL = 2.0  # replicas of work up to which the room is in proportion


def _with_room(work: float, utilization: float) -> float:
    """Replicas for ``work`` (replica-seconds/s) with room: work / ``utilization`` up to
    ``ROOM_POOL`` replicas' worth; beyond, room growing as its square root."""
    room = 1.0 / utilization - 1.0
    if work <= ROOM_POOL:
        return work * (1.0 + room)
    return work + room * math.sqrt(ROOM_POOL * work)


class Planner:
    """One workload's planner; call ``observe`` about once a second."""

    def __init__(self, config: PlannerConfig = DEFAULTS) -> None:
        self.config = config
        self._second: int | None = None  # the last second observed
        self._waiting = 0.0
        bins = config.bins
        self._arrived = Window(bins(max(BURST_SPANS[-1], STEADY_S, TREND_S)), slopes=True)
        self._bursts = Bursts(config)
        self._served = Window(bins(REQUEST_MEMORY_S))
        self._finished = Window(bins(REQUEST_MEMORY_S))
        self._running = Window(bins(REQUEST_MEMORY_S))  # requests in the pods' batches
        self._queued = Window(bins(STEADY_S) + 1)  # requests waiting
        self._prompts = Window(bins(REQUEST_MEMORY_S))  # prompt tokens/s
        self._generated = Window(bins(REQUEST_MEMORY_S))  # generation tokens/s
        # running sequences x the share of their pod's time prefill leaves to decode
        self._decoding = Window(bins(REQUEST_MEMORY_S))
        # KV-cache use, percent summed over Ready pods
        self._kv = Window(bins(TREND_S), slopes=True)
        self._hold = Hold()
        self._drain = Drain(config)
        self._since: int | None = None  # first second of the current history
        self._capacity = Capacity(config)
        self._batch_capacity = 1.0
        self._startup = Startup(config)
        self.plan: Plan | None = None
        self._failed_at: float | None = None
        self._why = "no observation yet"

    @property
    def startup(self) -> float:
        """The start-up planned with now, seconds (configured, measured or the default)."""
        return self._startup.seconds

    @property
    def startup_source(self) -> str:
        return self._startup.source

    @property
    def capacity(self) -> float:
        """Learned: what a Ready pod delivers of the configured replica-seconds (<= 1) -
        the smaller of what queued pods showed and what the KV cache's batch allows."""
        return min(self._capacity.value, self._batch_capacity)

    @property
    def batch_capacity(self) -> float:
        """What the KV cache's batch allows a replica on the prompts seen (``learned``)."""
        return self._batch_capacity

    def hold(self) -> float:
        """The scale-down hold: ``hold_s``, or one start-up."""
        c = self.config
        return self.startup if c.hold_s is None else c.hold_s

    def fail(self, now: float, why: str) -> None:
        """An observation could not be made (the caller's reason, for the answer)."""
        if self._failed_at is None:
            self._failed_at = now
        self._why = why

    @property
    def problem(self) -> str | None:
        """Why the latest observation failed, while it does (None when it did not)."""
        return self._why if self._failed_at is not None else None

    def current(self, now: float) -> Plan:
        """The latest plan, or PlanUnavailable when there is none fresh enough."""
        plan = self.plan
        if plan is None:
            raise PlanUnavailable(f"planner: no plan yet ({self._why})")
        if is_stale(now - plan.at, self.config.stale_s):
            why = (self._why if self._failed_at is not None else
                   "not observed since: is the scaler's planner loop running?")
            raise PlanUnavailable(f"planner: no usable observation for "
                                  f"{now - plan.at:.0f}s ({why})")
        return plan

    def observe(self, now: float, obs: Observation) -> Plan:
        c = self.config
        second = math.floor(now / c.resolution_s)  # the bin
        served = c.work(obs.prompt_tps, obs.generation_tps)
        self._failed_at, self._why = None, "ok"
        if self._second is not None and second <= self._second:
            # A second observation within one second: the queue change is kept for the
            # next second; the plan is made again from what is known.
            return self._make(now, obs, served)
        gap = 1 if self._second is None else second - self._second
        fresh = self._second is None
        if gap > c.bins(MAX_GAP_S):  # a long gap: what came before says nothing about now
            self._restart()
            gap, fresh = 1, True  # (the queue is the backlog term's, not a burst)
        request = self._request_work()
        grown = 0.0 if fresh else (obs.waiting - self._waiting) * request
        arrived = max(0.0, served + grown / (gap * c.resolution_s))
        for _ in range(gap):  # unseen seconds are taken as the one seen after them
            self._arrived.push(arrived)
            self._bursts.add(arrived)
            self._served.push(served)
            self._finished.push(obs.finished_rate)
            self._running.push(obs.running)
            self._queued.push(obs.waiting)
            self._prompts.push(obs.prompt_tps)
            self._generated.push(obs.generation_tps)
            self._decoding.push(decoding(c, obs))
            self._kv.push(obs.kv_cache)
        self._capacity.learn(obs, served, gap)
        self._batch_capacity = self._read_batch_capacity()
        self._startup.learn(obs)
        self._second, self._waiting = second, obs.waiting
        if self._since is None:
            self._since = second
        self._bursts.remember(second, self._arrived, self.delay(), self.hold())
        return self._make(now, obs, served, arrived)

    def _restart(self) -> None:
        for window in (self._arrived, self._served, self._finished, self._running, self._queued,
                       self._prompts, self._generated, self._decoding, self._kv):
            window.clear()
        self._bursts.clear()
        self._hold.clear()
        self._drain.clear()
        self._since = None
        self._capacity.clear()

    def _read_batch_capacity(self) -> float:
        n = min(len(self._decoding.values), len(self._kv.values))
        return batch_capacity(self.config, BatchSums(
            self._prompts.last(n), self._generated.last(n), self._finished.last(n),
            self._running.last(n), self._kv.last(n), self._decoding.last(n)),
            self.config.resolution_s)

    def delay(self) -> float:
        """The queueing budget: ``delay_s``; with a TTFT objective, the objective for the
        mean prompt the engines have shown (the configured prompt until enough requests
        have finished) - ``ttft_s`` plus that prompt's ``ttft_per_token_s`` allowance -
        less that prompt's prefill, at least 5 % of the objective."""
        c = self.config
        if c.ttft_s is None:
            return c.delay_s
        prompt = per_request(self._prompts, self._finished, self._enough_finished(),
                             c.prompt_tokens)
        objective = c.ttft_s + prompt * c.ttft_per_token_s
        return max(0.05 * objective, objective - prompt / c.prefill_tps)

    def _enough_finished(self) -> bool:
        """Enough requests have finished in the recent window for a mean of one (10)."""
        return self._finished.last(len(self._finished.values)) * self.config.resolution_s >= 10

    def _request_work(self) -> float:
        """Mean replica-seconds of one request: served work over finished requests in the
        recent window, the configured request until requests have finished."""
        c = self.config
        return per_request(self._served, self._finished, self._enough_finished(),
                           c.work(c.prompt_tokens, c.output_tokens))

    def _request_seconds(self) -> float | None:
        """Mean seconds a request runs (Little's law: requests running over requests
        finishing a second, over the recent window); with less than one request finished
        in the window, the window's length times the requests running (at least that: a
        run as long as the window). None until a minute has been seen."""
        c = self.config
        n = len(self._running.values)
        if n < c.bins(BASE_BLOCK_S):
            return None
        return self._running.last(n) / max(self._finished.last(n), 1.0 / c.resolution_s)

    def _make(self, now: float, obs: Observation, served: float,
              arrived: float | None = None) -> Plan:
        c = self.config
        startup = self.startup
        second = self._second if self._second is not None else math.floor(now)
        request = self._request_work()
        seen = len(self._arrived.values)
        n = min(c.bins(STEADY_S), seen)
        decode = joined(c, self._running, self._queued, n, obs, decode_work(
            c, self._generated, self._finished, self._enough_finished()))
        now_rate = (self._arrived.last(n) / n if n else served) + decode
        growth = load_growth(c, self._arrived, startup, now_rate,
                             self._bursts.recurrence.expected)
        k = self.capacity
        load = _with_room(now_rate / k, c.utilization)
        steady = _with_room((now_rate + growth) / k, c.utilization)
        burst, excess = self._bursts.term(now_rate, second, self.hold(), startup)
        if seen >= c.bins(QUIET_S) and self._arrived.last(c.bins(QUIET_S)) <= 0:
            burst = 0.0  # quiet for QUIET_S: no headroom held for a workload that has gone
        burst /= k
        concurrency = obs.running / (c.max_batch * c.utilization)
        # Long generations fill the cache over minutes (each sequence's context grows
        # until it ends): plan for the fill a start-up ahead, as for the load.
        kv_grows = kv_growth(c, self._kv, startup, obs.kv_cache)
        kv = (obs.kv_cache + kv_grows) / c.kv_target
        kv_now = obs.kv_cache / c.kv_target
        backlog = obs.waiting * request / startup / k
        # Never below the work the Ready pods have been doing these last seconds (a mean:
        # one second of prefill alone would hold a replica for a start-up).
        m = min(c.bins(CURRENT_S), len(self._served.values))
        current = (self._served.last(m) / m if m else served) / k
        required = max(steady, burst, concurrency, kv, current) + backlog
        unheld = math.ceil(required - 1e-9) if required > 0 else 0
        # The hold keeps the load that is here, not its forecast growth or the backlog -
        # nor the burst term, which its own memory keeps (holding it too kept the count of
        # a level left behind a start-up longer; only a memory shorter than the hold is).
        # Nor the queue a burst left: while it drains, the pods serve more than arrives and
        # their batches and caches are full of it. The served work is no load that is
        # here, and the running sequences (and the KV they hold) count at the share the
        # arrivals sustain (Little's law: arrivals x the seconds a request runs).
        request_s = self._request_seconds()
        sustained = 1.0
        if request_s is not None and obs.running > 0 and request > 0:
            sustained = min(1.0, now_rate / request * request_s / obs.running)
        other = max(sustained * concurrency, sustained * kv_now,
                    burst if c.memory_s < self.hold() else 0.0)
        here = max(load, other)
        held = math.ceil(here - 1e-9) if here > 0 else 0
        hold = c.bins(self.hold())
        replicas = max(unheld, self._hold.keep(
            second, hold, math.ceil(other - 1e-9) if other > 0 else 0, now_rate / k,
            fall(c, self._arrived) / k, lambda work: _with_room(work, c.utilization)))
        warming = self._since is None or second - self._since < hold
        if warming:
            replicas = max(replicas, obs.ready + obs.starting)
        drain_floor = self._drain.floor(second, obs, request_s)
        if drain_floor <= replicas:
            drain_floor = 0  # (reported only where it holds the plan up)
        replicas = max(replicas, drain_floor)
        self._drain.took_step(second, obs, replicas, request_s)
        extra = spare(c.spare_replicas, replicas, obs.ready, warming)
        self.plan = Plan(replicas + extra, now, steady, burst, concurrency, kv, backlog, required,
                         unheld, arrived if arrived is not None else
                         (self.plan.arrived if self.plan else served),
                         request, k, obs.ready, obs.starting, warming, growth, kv_grows,
                         excess, startup, self.startup_source, self._startup.pods, held,
                         math.nan if request_s is None else request_s, drain_floor,
                         self._batch_capacity, extra, decode)
        return self.plan
