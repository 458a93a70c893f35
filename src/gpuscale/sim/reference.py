"""The hindsight reference: the cheapest replica schedule found, with every arrival known in
advance, that meets the objective in the simulator - what a policy that cannot see the
future has to beat, and the figure every policy's cost is compared with.

A schedule is the replica count in effect in each simulated step (``Result.steps``),
followed as it is by ``run_policy``: the same serving model, the same cold-start draws
(numbered by creation, as for every policy), billed from the moment a replica is asked for
and through its drain. The reference is searched, not derived:

1. **Starts.** Every policy's own schedule, as it ran (replayed, it is the same run: same
   draws, same bill, same minutes), and one made from the work itself: each step, the
   replicas the next minute's work needs at 80 % busy (``needed_replicas``), asked for a
   mean cold start ahead, then repaired - a replica added from the slowest cold start before
   each minute that missed to its end - until no minute misses or ``REPAIR_ROUNDS`` are
   spent.
2. The best start: the fewest SLO-violating minutes, then the fewest GPU-hours.
3. **Descent.** Replica-steps are taken away in blocks of ``step_s`` seconds (one replica
   fewer in every step of a block). A set of such moves is kept when the schedule it makes
   misses no more minutes than the start did and costs fewer GPU-hours - one simulation for
   the whole set; a set that fails is split in halves, each tried again (so the moves that
   fit cost a few runs, not one each). Moves, in this order: the edges (a block holding a
   replica its neighbour does without, and the window's last block), until none is kept;
   then whole plateaus (consecutive blocks at one level) lowered by one; then the blocks
   halve, down to ``MIN_STEP_S``. A run that has already missed more minutes than allowed
   stops at that minute (``run_policy(until=...)``), so a failed move costs less than a
   whole replay.
4. **Stopping.** The search has *converged* when one whole round of moves (edges, then
   plateaus) at the finest step keeps nothing: no single move this search can make saves
   anything, and as the moves follow from the schedule alone, another round would try the
   same ones. Otherwise it *stopped at its budget* of ``max_runs`` simulations (None: no
   budget, it runs until it converges; it always does, as every kept move takes at least
   one replica-step away). ``Reference`` says which, the step it was at, and when the last
   saving came: a search stopped while it was still saving has a cheaper schedule ahead.

So by construction the reference's (SLO minutes, GPU-hours) is never worse than any start's
- every policy's included: none misses fewer minutes, and none missing as few costs less.
It is a feasible schedule, so it is also an upper bound on the cheapest one: the optimum
lies between the fluid bound (``sim.fluid_bound``, below every schedule) and it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from gpuscale.models.serving import InFlightRequest, ServingModel, ServingParams, needed_replicas
from gpuscale.models.slo import DEFAULT_SLO, SloSpec
from gpuscale.sim.simulate import Result, run_policy
from gpuscale.traffic.trace import TraceRequest

NAME = "hindsight reference"
REPAIR_ROUNDS = 12
STEP_S = 60.0
MIN_STEP_S = 15.0
MAX_RUNS = 400
_SAVING = 1e-9  # GPU-hours: a kept move must save more than rounding


SearchState = Literal["converged", "budget"]


@dataclass(frozen=True, slots=True)
class Reference:
    """The searched schedule's run, and how it was found (see the module's "Stopping")."""

    result: Result
    start: str  # the start the descent began from (a policy's name, or "work")
    start_gpu_hours: float
    runs: int  # simulations the search made, the starts' own runs not counted
    complete: bool  # True: converged; False: ``max_runs`` ended the search before it did
    step_s: float = STEP_S  # the block of steps its moves were at when it ended
    # (run, GPU-hours) after each saving kept, in order: the last is when it last improved
    savings: tuple[tuple[int, float], ...] = ()
    max_runs: int | None = MAX_RUNS  # its budget (None: until converged)

    @property
    def state(self) -> SearchState:
        return "converged" if self.complete else "budget"

    @property
    def last_improvement(self) -> int | None:
        """The run that made the last saving (None: nothing saved on the best start)."""
        return self.savings[-1][0] if self.savings else None

    def describe(self) -> str:
        """One line on how the search ended, for a person."""
        last = ("no saving on its start" if not self.savings else
                f"last saving at run {self.savings[-1][0]} "
                f"({self.start_gpu_hours:.2f} -> {self.result.gpu_hours:.2f} GPU-h from "
                f"{self.start})")
        if self.max_runs == 0:
            return f"the reference was not searched (--search-runs 0): the best start, {self.start}"
        if self.complete:
            return (f"the reference's search converged after {self.runs} simulations (no "
                    f"move saves at a {self.step_s:g} s step); {last}")
        return (f"the reference's search stopped at its budget of {self.max_runs} "
                f"simulations before converging, at a {self.step_s:g} s step: a cheaper "
                f"schedule may exist; {last} (--search-runs: a larger budget, or 'all')")


def work_start(requests: Sequence[TraceRequest], duration: float, params: ServingParams,
               slo: SloSpec = DEFAULT_SLO, dt: float = 1.0, floor: int = 0) -> Result:
    """The start made from the work: the replicas the next minute needs, asked for a mean
    cold start ahead, repaired around every minute that missed (see the module); never
    below ``floor``."""
    need = needed_replicas(requests, duration, params)
    steps = int(duration / dt)
    ahead = max(0, round(params.cold_start_s / dt))
    counts = [max(floor, *(need[min(k, len(need) - 1):min(k + ahead + 1, len(need))] or [1]))
              for k in range(steps)]
    result = run_policy("work", requests, duration, params, schedule=counts, slo=slo, dt=dt)
    # A replica may take up to the spread's top to start: a repair reaches back that far.
    lead = max(params.cold_start_s, params.cold_start_spread[1])
    for _ in range(REPAIR_ROUNDS):
        if not result.slo_violation_minutes:
            break
        for m in result.bad_minutes:
            first = max(0, int((m * 60 - lead - 60) / dt))
            for k in range(first, min(steps, int((m + 1) * 60 / dt))):
                counts[k] += 1
        result = run_policy("work", requests, duration, params, schedule=counts, slo=slo,
                            dt=dt)
    return result


def hindsight_reference(requests: Sequence[TraceRequest], duration: float,
                        params: ServingParams, starts: Sequence[Result],
                        slo: SloSpec = DEFAULT_SLO, dt: float = 1.0,
                        step_s: float = STEP_S, max_runs: int | None = MAX_RUNS,
                        progress: Callable[[float], None] | None = None,
                        floor: int = 0) -> Reference:
    """Search from the best of ``starts`` (each a ``run_policy`` result over these requests,
    with its ``steps``); ``work_start`` is added to them. ``max_runs``: at most this many
    simulations (0: the best start as it is; None: until it converges). ``progress``: a
    fraction of the budget, or without one of the step sizes gone through. ``floor``: no
    step goes below it (the policies' ``min_replicas``, so the reference keeps their
    constraint: with 1, it does not save the idle tail after the last request that no
    policy at 1 can; a start below it is not used)."""
    candidates = [s for s in starts if len(s.steps) == int(duration / dt)
                  and min(s.steps, default=floor) >= floor]
    candidates.append(work_start(requests, duration, params, slo, dt, floor))
    best = min(candidates, key=lambda r: (r.slo_violation_minutes, r.gpu_hours))
    budget = math.inf if max_runs is None else max_runs
    search = _Descent(requests, duration, params, slo, dt, best, budget, floor)
    block = max(1, round(step_s / dt))
    finest = max(1, round(MIN_STEP_S / dt))
    sizes = 1 + max(0, math.ceil(math.log2(block / finest))) if block > finest else 1
    converged = False
    while search.runs < budget:
        if progress is not None:
            progress(min(1.0, search.runs / max_runs) if max_runs else
                     min(0.99, (sizes - 1 - math.log2(max(1, block / finest))) / sizes))
        search.cut = False
        if search.apply(_edges(search.counts, block, floor)):
            continue
        if search.apply(_plateaus(search.counts, block, floor)):
            continue
        if block <= finest:
            converged = not search.cut  # a whole round kept nothing: no move saves
            break
        block = max(finest, block // 2)
    if progress is not None:
        progress(1.0)
    final = search.result
    result = Result(NAME, final.gpu_hours, final.slo_violation_minutes, final.minutes,
                    final.replica_changes_per_hour, final.max_replicas, final.p95_ttft_s,
                    final.unserved, timeline=final.timeline, bad_minutes=final.bad_minutes,
                    steps=final.steps, cut_requests=final.cut_requests,
                    p95_tpot_s=final.p95_tpot_s)
    return Reference(result, best.policy, best.gpu_hours, search.runs, converged,
                     block * dt, tuple(search.savings), max_runs)


Move = tuple[int, int]  # a block of steps [first, end) that loses one replica


class _Descent:
    """The schedule kept so far, and the simulations that test moves on it."""

    def __init__(self, requests: Sequence[TraceRequest], duration: float,
                 params: ServingParams, slo: SloSpec, dt: float, start: Result,
                 max_runs: float, floor: int) -> None:
        self.requests, self.duration, self.params = requests, duration, params
        self.slo, self.dt, self.max_runs, self.floor = slo, dt, max_runs, floor
        self.counts = list(start.steps)
        self.result = start
        self.allowed = start.slo_violation_minutes
        self.runs = 0
        self.cut = False  # a move was left untried for the budget (since last cleared)
        self.savings: list[tuple[int, float]] = []  # (run, GPU-hours) of each kept saving
        minutes = max(1, int(duration // 60))
        self._arrivals = [0] * minutes
        for r in requests:
            m = int(r.arrival_s // 60)
            if m < minutes:
                self._arrivals[m] += 1

    def apply(self, moves: list[Move]) -> bool:
        """Keep what fits of ``moves`` (halving sets that do not); True when any was kept."""
        if not moves:
            return False
        if self.runs >= self.max_runs:
            self.cut = True
            return False
        trial = _lowered(self.counts, moves, self.floor)
        if trial == self.counts:
            return False
        got = self._run(trial)
        if (got.stopped_at is None and got.slo_violation_minutes <= self.allowed
                and got.gpu_hours < self.result.gpu_hours - _SAVING):
            self.counts, self.result = trial, got
            self.savings.append((self.runs, got.gpu_hours))
            return True
        if len(moves) == 1:
            return False
        half = len(moves) // 2
        left = self.apply(moves[:half])
        right = self.apply(moves[half:])
        return left or right

    def _run(self, counts: list[int]) -> Result:
        self.runs += 1
        watch = _Watch(self.slo, self._arrivals, self.allowed)
        return run_policy(NAME, self.requests, self.duration, self.params, schedule=counts,
                          slo=self.slo, dt=self.dt, until=watch)


def _lowered(counts: list[int], moves: list[Move], floor: int) -> list[int]:
    out = list(counts)
    for first, end in moves:
        for k in range(first, end):
            out[k] = max(floor, out[k] - 1)
    return out


def _blocks(counts: list[int], block: int) -> list[Move]:
    return [(b, min(len(counts), b + block)) for b in range(0, len(counts), block)]


def _edges(counts: list[int], block: int, floor: int) -> list[Move]:
    """Blocks that hold a replica a neighbouring block does without (somewhere in it), and
    the window's last block: taking a replica-step there moves a scale-up later or a
    scale-down earlier, never opens a gap a cold start has to fill."""
    blocks = _blocks(counts, block)
    out = []
    for i, (first, end) in enumerate(blocks):
        top = max(counts[first:end])
        if top <= floor:
            continue
        lows = [min(counts[a:b]) for a, b in blocks[max(0, i - 1):i + 2] if (a, b) != (first, end)]
        if i == len(blocks) - 1 or any(low < top for low in lows):
            out.append((first, end))
    return out


def _plateaus(counts: list[int], block: int, floor: int) -> list[Move]:
    """Runs of consecutive blocks whose highest count is the same, each as one move."""
    out: list[Move] = []
    for first, end in _blocks(counts, block):
        top = max(counts[first:end])
        if top <= floor:
            continue
        if out and max(counts[out[-1][0]:out[-1][1]]) == top and out[-1][1] == first:
            out[-1] = (out[-1][0], end)
        else:
            out.append((first, end))
    return out


class _Watch:
    """``run_policy``'s ``until``: true once more minutes have certainly missed the
    objective than ``allowed`` - a minute whose arrivals already include more requests over
    the target than its quantile lets through (their measures can only grow)."""

    def __init__(self, slo: SloSpec, arrivals: list[int], allowed: int) -> None:
        self.slo, self.arrivals, self.allowed = slo, arrivals, allowed
        self.over: dict[int, set[int]] = {}
        self.done = 0  # finished requests already looked at
        self.missed: set[int] = set()

    def __call__(self, model: ServingModel, now: float) -> bool:
        fresh = model.done[self.done:]
        self.done = len(model.done)
        running = (r for rep in model.replicas + model.draining for r in rep.running)
        for group in (fresh, running, model.queue):
            for req in group:
                self._look(req, now)
        return len(self.missed) > self.allowed

    def _look(self, req: InFlightRequest, now: float) -> None:
        m = int(req.arrival // 60)
        if m >= len(self.arrivals) or m in self.missed:
            return
        if self.slo.at_least(req, now) <= self.slo.target_s:
            return
        over = self.over.setdefault(m, set())
        over.add(id(req))
        n = self.arrivals[m]
        if len(over) >= n - math.ceil(self.slo.quantile * n) + 1:
            self.missed.add(m)
