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
  requests, over the last minutes).
- **steady** (Little's law): the mean arrived work over the last minute, plus its growth
  over one start-up (the least-squares slope of the last ``TREND_S`` seconds, when
  positive, times the start-up, at most ``TREND_CAP`` of the load: a replica asked for
  now serves the load of a start-up from now), over the target busy fraction
  ``utilization``: replicas that carry the work in flight with room left.
- **burst**: the smallest service rate that keeps every arrival of the remembered
  history (``memory_s``, at 1-s resolution) within the queueing-delay budget (``delay_s``,
  or a TTFT objective less the prefill of the mean prompt seen, ``delay()``):
  a server of rate c keeps each arrival's wait within D exactly when the work arriving in
  every interval of length L is at most c x (L + D) (the delay bound of a constant-rate
  server). Taken over intervals up to ``BURST_SPANS[-1]`` seconds (longer ones are what
  ``steady`` follows). This is what a 15 s scrape cannot see. A burst is remembered as
  two figures: that rate, and its **excess** over the level it stood on (the quietest
  minute of the ``BURST_BASE_S`` before it); the term is the smaller of the largest
  remembered rate and the current level (the steady term's mean) plus the largest
  remembered excess. So a workload that bursts keeps its headroom *above its level*
  for ``memory_s``, and when the level itself falls (the evening side of a day), the
  capacity of the morning's level is not held for the memory's 15 minutes. A rate the
  load keeps for ``LEVEL_S`` (every whole minute at least ``LEVEL_SHARE`` of it) is a
  level, not a burst - a step up, a day's peak: it is no excess, and the excess
  remembered on the way up to it is forgotten (measured: a step that lasts 12 minutes
  no longer holds its height as headroom for 15 more; -6 % GPU-hours on ``steps``, -2-3 %
  on ``ramp`` and ``diurnal``, no load missing more minutes).
- **concurrency**: running sequences over ``max_batch`` at ``utilization`` (full batches
  cannot take the next request; waiting ones are the backlog's); **kv**: the Ready pods'
  KV-cache use, plus its growth over one start-up (the ``TREND_S`` slope, at most
  ``KV_TREND_CAP`` of the use: long generations fill the cache for minutes while the work
  per second stays low), over ``kv_target`` (a full cache stops the batch from growing).
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
  only below 1, it divides the work terms. A capacity configured too low only costs
  GPU-hours; too high would plan too few replicas, and this corrects it from the engines'
  own counters.

planned = ceil(max(steady, burst, concurrency, kv, current) + backlog) - ``current``
being the work the Ready pods served over the last ``CURRENT_S`` seconds, so a plan is
never below what runs now - and never below the largest **held** count of the last
``hold_s`` (default: the start-up time; capacity given back that is needed again within a
start-up costs a cold start of missed SLO). The hold keeps the load that is here:
ceil(max(steady and kv without their growth, burst, concurrency, current)). The forecast
growth and the backlog are planned for while they last, not held: a trend that a step in
the load made (the 5-minute slope of a load that jumped and stays flat) is gone once the
step is, and the replicas that drain a queue are not needed once it is drained (measured:
holding them cost 8 % more GPU-hours over the benchmark's loads, for no fewer missed
minutes). Until the planner has seen a whole hold window it never plans below the pods
that exist (it has not seen enough to know they are not needed).

**Draining** (``drain_s``, the pods' termination grace): a removed pod finishes what it
runs for ``drain_s``, then the rest is cut and starts over (its time to first token counts
from its arrival). A request runs ``request_s`` on average (Little's law: running over
finished, the last ``REQUEST_MEMORY_S``). Taking run times as exponential, removing m of N
Ready pods cuts m / N x ``_cut_share`` of a minute's requests - e^(-drain_s / request_s) of
those in flight, and requests that arrived more than a run time before the removal have
mostly ended. The plan goes below the Ready pods by at most as many as keep that within
``CUT_SHARE``, and after a step that cuts, not again until the minutes it cut are over
(the longer of a minute and ``request_s``; sooner if pods are added). Until a minute has
been seen, a planner with requests running keeps the Ready pods. With chat requests (a few
seconds) nothing is held; reasoning-length outputs (minutes) on a handful of pods keep
their pods while requests run (measured: 9-12 missed minutes an hour become 1-2, at the
GPU-hours the hindsight reference spends), and so do requests of 20 s or more on 3 pods or
fewer (a 30-s grace). A grace longer than the requests (``terminationGracePeriodSeconds``
and ``drainSeconds``, with an engine that drains on SIGTERM) frees the plan. A restarted
scaler forgets the last step's wait (it keeps the pods that exist for a hold first).

The plan is a total, not an increment: pods that are starting are part of it (they are on
their way; the HPA counts them in its current replicas) and are never asked for twice. KEDA's
AverageValue target T makes the HPA compute ceil(value / T): the service answers
``planned x T``. Missing data is never a smaller plan: a Ready pod without its counters
makes the observation unusable (the caller raises UNAVAILABLE), and a planner that has had
no usable observation for ``stale_s`` answers UNAVAILABLE with the last reason.

Pure: no I/O, no clock of its own (the caller passes ``now``).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from gpuscale.common.errors import DataUnavailable

#: Burst lengths looked at, seconds: a grid, so a burst between two of them is counted at
#: the nearest shorter one plus its neighbours' quiet seconds (at most ~4 % low at 10 s).
BURST_SPANS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 20, 25, 30, 40, 50, 60, 75, 90, 105, 120)
BURST_BUCKET_S = 10  # remembered burst rates within this many seconds share one entry
BURST_BASE_S = 600  # a burst's excess is over the quietest minute of this window before it
BASE_BLOCK_S = 60
LEVEL_S = 300  # a burst rate the load keeps this long is its level (whole minutes)
LEVEL_SHARE = 0.9  # ... every minute of it at least this share of the rate
STEADY_S = 60  # the window of the steady term
TREND_S = 300  # the load's growth is the least-squares slope over this window
TREND_CAP = 0.5  # growth planned for over a start-up, at most this fraction of the load
KV_TREND_CAP = 0.5  # the KV cache's fill planned for, at most this fraction of its use
REQUEST_MEMORY_S = 300  # the window of the mean work of one request
MAX_GAP_S = 30  # a longer gap between observations restarts the arrival history
REBASE_AFTER = 1 << 16  # values pushed before a window's running sums are recomputed
CURRENT_S = 10  # the window of the current term
SATURATED_S = 5  # a queue this long means the Ready pods serve all they can
CAPACITY_WEIGHT = 0.05  # of each saturated second in the learned capacity
MIN_CAPACITY = 0.25
CUT_SHARE = 0.02  # of the requests in flight a scale-down may cut (a p95 objective has 5 %)
DEFAULT_STARTUP_S = 300.0  # until pods have shown theirs: a slow start (cold node, big image)
STARTUP_SAMPLES = 32  # the newest pods' start-ups kept
STARTUP_MIN_SAMPLES = 3  # measured start-ups needed before they replace the default
STARTUP_QUANTILE = 0.9  # of the measured start-ups: what the plan looks ahead by
MAX_STARTUP_S = 7200.0  # a longer "start-up" is not one (a Ready pod restarted later)


class PlanUnavailable(DataUnavailable):
    """The planner cannot give a count it can stand behind; the message says why."""


@dataclass(frozen=True, slots=True)
class PlannerConfig:
    """One workload's planning parameters (trigger metadata; see ``scaler.core.trigger``)."""

    delay_s: float = 2.0  # the queueing-delay budget (the SLO less the prefill itself)
    ttft_s: float | None = None  # a TTFT objective: the budget follows the mean prompt
    startup_s: float | None = None  # creation to Ready of a new replica; None: measured
    prefill_tps: float = 30_000.0  # prompt tokens/s one replica prefills, fully busy
    decode_tps: float = 12_000.0  # generated tokens/s one replica decodes at full batch
    max_batch: int = 256  # sequences one replica runs at once (vLLM's max_num_seqs)
    utilization: float = 0.85  # the busy fraction the steady term aims at
    kv_target: float = 90.0  # percent of KV cache a pod may use before another is needed
    memory_s: float = 900.0  # how long a burst is remembered
    burst_s: float = 120.0  # the longest burst the burst term looks at
    trend: bool = True  # plan for the load's growth over a start-up
    hold_s: float | None = None  # scale-down hold; None: one start-up
    prompt_tokens: float = 1_000.0  # a request's tokens until the engine has shown its own
    output_tokens: float = 250.0
    stale_s: float = 10.0  # no usable observation for this long: UNAVAILABLE
    resolution_s: float = 1.0  # the width of one bin of history (the planner's "second")
    drain_s: float = 30.0  # a removed pod's grace to finish its requests (Kubernetes': 30)

    def bins(self, seconds: float) -> int:
        """How many bins of history ``seconds`` are (at least one)."""
        return max(1, round(seconds / self.resolution_s))

    def work(self, prompt: float, output: float) -> float:
        """Replica-seconds of ``prompt`` prefilled and ``output`` generated tokens."""
        return prompt / self.prefill_tps + output / self.decode_tps


@dataclass(frozen=True, slots=True)
class PodLoad:
    """One Ready pod's own share of an observation (for the capacity it delivers)."""

    name: str
    prompt_tps: float
    generation_tps: float
    waiting: float


@dataclass(frozen=True, slots=True)
class Observation:
    """One moment of a workload: sums over its Ready pods that report, and its pods.
    ``pods``: each Ready pod's own load, when the caller has it (the capacity is then
    learned per pod; without it, from the sums)."""

    prompt_tps: float
    generation_tps: float
    finished_rate: float  # requests/s
    waiting: float
    running: float
    kv_cache: float  # percent, summed over Ready pods
    ready: int
    starting: int  # pods of the workload that are not Ready yet
    pods: tuple[PodLoad, ...] = ()
    # (pod, seconds from its creation to its first Ready) for the workload's pods whose
    # start-up the caller measured (its pod watch); seen again every second, counted once
    startups: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True, slots=True)
class Plan:
    """A planned replica count and every term it came from (for a person, and /metrics)."""

    replicas: int
    at: float  # when it was made (the caller's clock)
    steady: float
    burst: float
    concurrency: float
    kv: float
    backlog: float
    required: float  # max(steady, burst, concurrency, kv) + backlog
    unheld: int  # ceil(required), before the hold and the drain floor
    arrived: float  # work that arrived in the last second, replica-seconds
    request_work: float  # mean replica-seconds of one request
    capacity: float  # configured replica-seconds a Ready pod delivers per second (<= 1)
    ready: int
    starting: int
    warming: bool  # the planner has not seen a whole hold window yet
    growth: float = 0.0  # load growth over a start-up in steady, replica-seconds per second
    kv_growth: float = 0.0  # KV-cache fill over a start-up in kv, percent points
    burst_excess: float = 0.0  # the remembered excess inside burst, replica-seconds/s
    startup: float = DEFAULT_STARTUP_S  # the start-up planned with, seconds
    startup_source: str = "default"  # "configured", "measured" or "default"
    startup_pods: int = 0  # pods whose start-up was measured (0: configured or default)
    held: int = 0  # the count the hold keeps: the load that is here, without growth or backlog
    request_s: float = math.nan  # mean seconds a request runs (NaN: not a minute seen)
    drain_floor: int = 0  # pods kept so a scale-down cuts at most CUT_SHARE (0: not binding)

    def terms(self) -> dict[str, float]:
        return {"steady": self.steady, "burst": self.burst, "concurrency": self.concurrency,
                "kv": self.kv, "backlog": self.backlog, "required": self.required,
                "unheld": float(self.unheld),
                "arrived": self.arrived, "request_work": self.request_work,
                "capacity": self.capacity, "growth": self.growth,
                "kv_growth": self.kv_growth, "burst_excess": self.burst_excess,
                "startup": self.startup,
                "startup_pods": float(self.startup_pods), "held": float(self.held),
                "request_s": self.request_s, "drain_floor": float(self.drain_floor),
                "ready": float(self.ready), "starting": float(self.starting)}


@dataclass(slots=True)
class _Window:
    """Per-second values over a bounded span, with prefix sums for interval sums and, with
    ``slopes``, least-squares slopes (a third deque: only the windows that need them)."""

    span: int
    slopes: bool = False
    values: deque[float] = field(default_factory=deque)
    prefix: deque[float] = field(default_factory=lambda: deque([0.0]))
    moments: deque[float] = field(default_factory=lambda: deque([0.0]))  # of k x value
    count: int = 0  # values ever pushed (the index k of the next one)

    def push(self, value: float) -> None:
        if self.count >= REBASE_AFTER:  # keep the sums small: float64 stays exact enough
            self._rebase()
        self._append(value)
        while len(self.values) > self.span:
            self.values.popleft()
            self.prefix.popleft()
            if self.slopes:
                self.moments.popleft()

    def _append(self, value: float) -> None:
        self.values.append(value)
        self.prefix.append(self.prefix[-1] + value)
        if self.slopes:
            self.moments.append(self.moments[-1] + self.count * value)
        self.count += 1

    def _rebase(self) -> None:
        """Recompute the running sums from the values held, indexed from 0: the sums
        otherwise grow with the process's age (k x value after a year at 1 Hz is ~1e10 per
        term), and the slope's difference of two such sums would lose its digits."""
        values = list(self.values)
        self.clear()
        for value in values:
            self._append(value)

    def last(self, n: int) -> float:
        """The sum of the last ``n`` values (fewer if fewer are held)."""
        n = min(n, len(self.values))
        return self.prefix[-1] - self.prefix[-1 - n]

    def slope(self, n: int) -> float:
        """Least-squares slope of the last ``n`` values per step (0 with fewer than 2)."""
        assert self.slopes, "a window kept without slopes"
        n = min(n, len(self.values))
        if n < 2:
            return 0.0
        total = self.last(n)
        weighted = self.moments[-1] - self.moments[-1 - n]
        mean_k = self.count - (n + 1) / 2  # mean index of the last n
        return (weighted - mean_k * total) / (n * (n * n - 1) / 12)

    def clear(self) -> None:
        self.values.clear()
        self.prefix.clear()
        self.prefix.append(0.0)
        self.moments.clear()
        self.moments.append(0.0)
        self.count = 0


def _remember(memory: deque[tuple[int, float, float]], second: int, value: float,
              rate: float, bucket: int, span: int) -> None:
    """Keep (``second``, ``value``, the burst ``rate`` it came from) in ``memory`` for
    ``span`` seconds, one entry a ``bucket`` (its largest value; a smaller value just after
    keeps it a few seconds longer instead). An entry goes early only when a newer one has
    as large a value *and* as high a rate: for an excess, one with a higher rate stays,
    since a level that reaches the newer rate (and forgets it as a level, see ``LEVEL_S``)
    may still lie below the older burst's. With ``value`` the rate itself (the remembered
    rates) the entries decrease: the first is the largest."""
    while memory and memory[-1][1] <= value and memory[-1][2] <= rate:
        memory.pop()
    if memory and memory[-1][0] // bucket == second // bucket:
        last = memory[-1]
        memory[-1] = (second, value, rate) if value > last[1] else (second, last[1], last[2])
    else:
        memory.append((second, value, rate))
    while memory[0][0] <= second - span:
        memory.popleft()


class Planner:
    """One workload's planner; call ``observe`` about once a second."""

    def __init__(self, config: PlannerConfig = PlannerConfig()) -> None:
        self.config = config
        self._second: int | None = None  # the last second observed
        self._waiting = 0.0
        bins = config.bins
        self._arrived = _Window(bins(max(BURST_SPANS[-1], STEADY_S, TREND_S)), slopes=True)
        # Arrived work per whole minute (BASE_BLOCK_S), the newest last, and the minute
        # being filled: the levels bursts stand on, kept small (a number a minute).
        self._blocks: deque[float] = deque(maxlen=math.ceil(
            (BURST_BASE_S + BURST_SPANS[-1]) / BASE_BLOCK_S) + 1)
        self._block = (0, 0.0)  # (bins in it, their sum)
        self._served = _Window(bins(REQUEST_MEMORY_S))
        self._finished = _Window(bins(REQUEST_MEMORY_S))
        self._running = _Window(bins(REQUEST_MEMORY_S))  # requests in the pods' batches
        self._prompts = _Window(bins(REQUEST_MEMORY_S))  # prompt tokens/s
        # KV-cache use, percent summed over Ready pods
        self._kv = _Window(bins(TREND_S), slopes=True)
        # (second, rate, rate), decreasing, and (second, excess, its rate): see _remember
        self._bursts: deque[tuple[int, float, float]] = deque()
        self._excess: deque[tuple[int, float, float]] = deque()
        self._minutes = 0  # whole minutes of arrivals seen (blocks made)
        self._pruned = 0  # ... when the excess was last pruned of levels
        self._held: deque[tuple[int, int]] = deque()  # (second, count), decreasing
        # (until, floor, Ready pods then): the last step down that cut requests
        self._cut: tuple[int, int, int] | None = None
        self._since: int | None = None  # first second of the current history
        self._queued = 0  # bins in a row with requests waiting
        self._queued_pods: dict[str, int] = {}  # the same, per Ready pod
        self.capacity = 1.0  # learned: what a Ready pod delivers of the configured
        self._startups: dict[str, float] = {}  # pod -> measured start-up, oldest first
        self._startup = (config.startup_s, "configured") if config.startup_s is not None \
            else (DEFAULT_STARTUP_S, "default")
        self.plan: Plan | None = None
        self._failed_at: float | None = None
        self._why = "no observation yet"

    @property
    def startup(self) -> float:
        """The start-up planned with now, seconds (configured, measured or the default)."""
        return self._startup[0]

    @property
    def startup_source(self) -> str:
        return self._startup[1]

    def hold(self) -> float:
        """The scale-down hold: ``hold_s``, or one start-up."""
        c = self.config
        return self.startup if c.hold_s is None else c.hold_s

    def _learn_startups(self, obs: Observation) -> None:
        """Keep each pod's measured start-up once (the newest ``STARTUP_SAMPLES`` pods),
        and plan with their ``STARTUP_QUANTILE`` unless the trigger gave one."""
        if self.config.startup_s is not None or not obs.startups:
            return
        added = False
        for pod, seconds in obs.startups:
            if pod in self._startups or not 0 < seconds <= MAX_STARTUP_S:
                continue
            self._startups[pod] = seconds
            added = True
            if len(self._startups) > STARTUP_SAMPLES:
                del self._startups[next(iter(self._startups))]
        if added and len(self._startups) >= STARTUP_MIN_SAMPLES:
            ordered = sorted(self._startups.values())
            rank = math.ceil(STARTUP_QUANTILE * len(ordered)) - 1  # nearest rank
            self._startup = (ordered[max(0, rank)], "measured")

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
        if now - plan.at > self.config.stale_s:
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
        block = c.bins(BASE_BLOCK_S)
        for _ in range(gap):  # unseen seconds are taken as the one seen after them
            self._arrived.push(arrived)
            n, total = self._block
            self._block = (n + 1, total + arrived)
            if n + 1 == block:
                self._blocks.append((total + arrived) / block)
                self._block = (0, 0.0)
                self._minutes += 1
            self._served.push(served)
            self._finished.push(obs.finished_rate)
            self._running.push(obs.running)
            self._prompts.push(obs.prompt_tps)
            self._kv.push(obs.kv_cache)
        self._learn_capacity(obs, served, gap)
        self._learn_startups(obs)
        self._second, self._waiting = second, obs.waiting
        if self._since is None:
            self._since = second
        self._remember_burst(second, self.delay())
        return self._make(now, obs, served, arrived)

    def _restart(self) -> None:
        for window in (self._arrived, self._served, self._finished, self._running,
                       self._prompts, self._kv):
            window.clear()
        self._bursts.clear()
        self._excess.clear()
        self._blocks.clear()
        self._block = (0, 0.0)
        self._held.clear()
        self._cut = None
        self._since = None
        self._queued = 0
        self._queued_pods.clear()

    def _learn_capacity(self, obs: Observation, served: float, bins: int) -> None:
        """While requests wait at a pod for a while, it serves all it can: its work is
        what one replica delivers of the configured capacity. Per pod when the
        observation has them (one saturated pod among idle ones says nothing of the idle
        ones: a sum would lower the capacity of all), else from the sums. Learned slowly,
        and only ever below the configuration (a capacity set too high would plan too few
        replicas; one set too low only costs GPU-hours)."""
        enough = self.config.bins(SATURATED_S)
        if obs.pods:
            queued = {p.name: self._queued_pods.get(p.name, 0) + bins
                      for p in obs.pods if p.waiting >= 1}
            self._queued_pods = queued
            self._queued = 0
            full = [p for p in obs.pods if queued.get(p.name, 0) >= enough]
            if not full:
                return
            sample = sum(min(1.0, self.config.work(p.prompt_tps, p.generation_tps))
                         for p in full) / len(full)
        else:
            self._queued_pods.clear()
            self._queued = self._queued + bins if obs.waiting >= 1 and obs.ready else 0
            if self._queued < enough:
                return
            sample = min(1.0, served / obs.ready)
        self.capacity = max(MIN_CAPACITY, min(1.0, self.capacity + CAPACITY_WEIGHT * (
            sample - self.capacity)))

    def delay(self) -> float:
        """The queueing budget: ``delay_s``; with a TTFT objective, the objective less the
        prefill of the mean prompt the engines have shown (the configured prompt until
        enough requests have finished), at least 5 % of the objective."""
        c = self.config
        if c.ttft_s is None:
            return c.delay_s
        n = len(self._finished.values)
        finished = self._finished.last(n)
        prompt = (self._prompts.last(n) / finished if self._enough_finished()
                  else c.prompt_tokens)
        return max(0.05 * c.ttft_s, c.ttft_s - prompt / c.prefill_tps)

    def _enough_finished(self) -> bool:
        """Enough requests have finished in the recent window for a mean of one (10)."""
        return self._finished.last(len(self._finished.values)) * self.config.resolution_s >= 10

    def _request_work(self) -> float:
        """Mean replica-seconds of one request: served work over finished requests in the
        recent window, the configured request until requests have finished."""
        n = len(self._served.values)
        if self._enough_finished():
            return self._served.last(n) / self._finished.last(n)
        c = self.config
        return c.work(c.prompt_tokens, c.output_tokens)

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

    def _cut_share(self, request_s: float) -> float:
        """Of a minute's requests, the share that removing every Ready pod would cut (one
        pod of N: this over N). A request that arrived x seconds before the removal is
        cut when it runs longer than x + ``drain_s``: with run times exponential of mean
        T, e^(-(x + drain_s) / T); averaged over the minute's arrivals,
        e^(-drain_s / T) x (T / 60)(1 - e^(-60 / T))."""
        if request_s <= 0:
            return 0.0
        t, w = request_s, float(BASE_BLOCK_S)
        return math.exp(-self.config.drain_s / t) * (t / w) * -math.expm1(-w / t)

    def _drain_floor(self, second: int, obs: Observation, request_s: float | None) -> int:
        """The fewest Ready pods a scale-down may leave now (see the module's
        "Draining"); 0 when nothing running would be cut."""
        if obs.running < 1:
            self._cut = None
            return 0
        if request_s is None:
            return obs.ready  # not a minute seen yet: keep the pods that run requests
        if self._cut is not None:
            until, floor, ready = self._cut
            if second < until and obs.ready <= ready:
                return floor  # a step down was taken: none again while it cuts
            self._cut = None
        share = self._cut_share(request_s)
        if share <= 0:
            return 0
        return max(0, obs.ready - math.floor(CUT_SHARE * obs.ready / share))

    def _took_step(self, second: int, obs: Observation, replicas: int,
                   request_s: float | None) -> None:
        """A plan below the Ready pods that cuts a measurable share (a tenth of
        ``CUT_SHARE``) starts the wait before the next: until the minutes whose requests
        it cut are over (the longer of a minute and ``request_s``)."""
        if (self._cut is not None or request_s is None or replicas >= obs.ready
                or obs.running < 1):
            return
        cut = (obs.ready - replicas) / obs.ready * self._cut_share(request_s)
        if cut >= CUT_SHARE / 10:
            wait = self.config.bins(max(request_s, float(BASE_BLOCK_S)))
            self._cut = (second + wait, replicas, obs.ready)

    def _remember_burst(self, second: int, delay: float) -> None:
        c = self.config
        arrived = self._arrived
        spans = [span for span in BURST_SPANS if span <= c.burst_s]
        rates = [arrived.last(c.bins(span)) * c.resolution_s / (span + delay)
                 for span in spans]
        rate = max(rates)
        # The level the bursts stand on: the quietest whole minute of the BURST_BASE_S
        # before the longest span (a minute, not the window's mean: bursts that recur
        # within the window would raise a mean and hide their own excess).
        recent = math.ceil(spans[-1] / BASE_BLOCK_S)  # minutes the spans may cover
        minutes = list(self._blocks)
        blocks = minutes[:-recent or None][-(BURST_BASE_S // BASE_BLOCK_S):]
        # (Until a minute before the longest span is known, the level is taken as 0: the
        # whole rate is excess, as the burst term was before it had a level.)
        excess = max(0.0, rate - (min(blocks) if blocks else 0.0))
        # A rate the load has kept for LEVEL_S (every whole minute of it at least
        # LEVEL_SHARE of the rate) is a level - a step, a day's peak - not a burst: it is
        # no excess, and what was remembered as one on the way up is forgotten.
        kept = minutes[-(LEVEL_S // BASE_BLOCK_S):]
        level = min(kept) if len(kept) == LEVEL_S // BASE_BLOCK_S else None
        if level is not None and level >= LEVEL_SHARE * rate:
            excess = 0.0
        if level is not None and self._pruned != self._minutes:
            self._pruned = self._minutes
            self._excess = deque(e for e in self._excess if level < LEVEL_SHARE * e[2])
        bucket, memory = c.bins(BURST_BUCKET_S), c.bins(c.memory_s)
        _remember(self._bursts, second, rate, rate, bucket, memory)
        _remember(self._excess, second, excess, rate, bucket, memory)

    def _make(self, now: float, obs: Observation, served: float,
              arrived: float | None = None) -> Plan:
        c = self.config
        startup = self.startup
        second = self._second if self._second is not None else math.floor(now)
        request = self._request_work()
        seen = len(self._arrived.values)
        n = min(c.bins(STEADY_S), seen)
        now_rate = self._arrived.last(n) / n if n else served
        growth = 0.0
        if c.trend and seen >= c.bins(TREND_S):
            slope = self._arrived.slope(c.bins(TREND_S)) / c.resolution_s  # per second
            growth = min(max(0.0, slope) * startup,
                         TREND_CAP * now_rate)
        k = self.capacity
        load = now_rate / c.utilization / k
        steady = load + growth / c.utilization / k
        excess = max((e[1] for e in self._excess), default=0.0)
        burst = min(self._bursts[0][1] if self._bursts else 0.0, now_rate + excess) / k
        concurrency = obs.running / (c.max_batch * c.utilization)
        kv_growth = 0.0
        if c.trend and len(self._kv.values) >= c.bins(TREND_S):
            # Long generations fill the cache over minutes (each sequence's context grows
            # until it ends): plan for the fill a start-up ahead, as for the load.
            slope = self._kv.slope(c.bins(TREND_S)) / c.resolution_s
            kv_growth = min(max(0.0, slope) * startup, KV_TREND_CAP * obs.kv_cache)
        kv = (obs.kv_cache + kv_growth) / c.kv_target
        kv_now = obs.kv_cache / c.kv_target
        backlog = obs.waiting * request / startup / k
        # Never below the work the Ready pods have been doing these last seconds (a mean:
        # one second of prefill alone would hold a replica for a start-up).
        m = min(c.bins(CURRENT_S), len(self._served.values))
        current = (self._served.last(m) / m if m else served) / k
        required = max(steady, burst, concurrency, kv, current) + backlog
        unheld = math.ceil(required - 1e-9) if required > 0 else 0
        # The hold keeps the load that is here, not its forecast growth or the backlog.
        here = max(load, burst, concurrency, kv_now, current)
        held = math.ceil(here - 1e-9) if here > 0 else 0
        while self._held and self._held[-1][1] <= held:
            self._held.pop()
        self._held.append((second, held))
        hold = c.bins(self.hold())
        while self._held[0][0] <= second - hold:
            self._held.popleft()
        replicas = max(self._held[0][1], unheld)
        warming = self._since is None or second - self._since < hold
        if warming:
            replicas = max(replicas, obs.ready + obs.starting)
        request_s = self._request_seconds()
        drain_floor = self._drain_floor(second, obs, request_s)
        if drain_floor <= replicas:
            drain_floor = 0  # (reported only where it holds the plan up)
        replicas = max(replicas, drain_floor)
        self._took_step(second, obs, replicas, request_s)
        self.plan = Plan(replicas, now, steady, burst, concurrency, kv, backlog, required,
                         unheld, arrived if arrived is not None else
                         (self.plan.arrived if self.plan else served),
                         request, k, obs.ready, obs.starting, warming, growth, kv_growth,
                         excess, startup, self.startup_source,
                         len(self._startups) if self.startup_source == "measured" else 0,
                         held, math.nan if request_s is None else request_s, drain_floor)
        return self.plan
