"""The planner's burst term (``scaler.core.planner``, **burst**): the smallest service rate
that keeps every arrival of the remembered history within the queueing-delay budget, and
the excess of each burst over the level it stood on, remembered for ``memory_s``: whole
for its first half, then less in a straight line to nothing (``faded``) - a burst at no
period that has not come back for ten minutes is less likely to within the next ten, and
holding its whole height to the memory's last second kept a surge's replicas for a
quarter of an hour after it on the shipped trace.

A server of rate c keeps each arrival's wait within D exactly when the work arriving in
every interval of length L is at most c x (L + D); that is taken over ``BURST_SPANS``. The
objective is a percentile per minute, so a clump may overflow that bound by what
``late_share`` of its minute's work absorbs (``remember``): the Poisson-like clumps of
long prompts that the batches absorb are not bursts; sustained excess is. The
level is the quietest whole minute of the ``BURST_BASE_S`` before the longest span; a rate
the load keeps for ``LEVEL_S`` (every whole minute at least ``LEVEL_SHARE`` of it) is a
level, not a burst, and the excess remembered on the way up to it is forgotten. The term is
the smaller of the largest remembered rate and the current level plus the largest
remembered excess.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

from gpuscale.scaler.core.plan_values import PlannerConfig
from gpuscale.scaler.core.recurrence import Recurrence
from gpuscale.scaler.core.windows import BASE_BLOCK_S, Window

#: Burst lengths looked at, seconds: a grid, so a burst between two of them is counted at
#: the nearest shorter one plus its neighbours' quiet seconds (at most ~4 % low at 10 s).
BURST_SPANS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 20, 25, 30, 40, 50, 60, 75, 90, 105, 120)
BURST_BUCKET_S = 10  # remembered burst rates within this many seconds share one entry
BURST_BASE_S = 600  # a burst's excess is over the quietest minute of this window before it
LEVEL_S = 300  # a burst rate the load keeps this long is its level (whole minutes)
LEVEL_SHARE = 0.9  # ... every minute of it at least this share of the rate
WHOLE_SHARE = 0.5  # a recurring burst's excess is held whole for this share of memory_s
#   and then less in a straight line, to nothing at its end (``faded``)


class Bursts:
    """One workload's remembered bursts, and the minutes of arrived work they stand on."""

    def __init__(self, config: PlannerConfig) -> None:
        self.config = config
        # Arrived work per whole minute (BASE_BLOCK_S), the newest last, and the minute
        # being filled: the levels bursts stand on, kept small (a number a minute).
        self._blocks: deque[float] = deque(maxlen=math.ceil(
            (BURST_BASE_S + BURST_SPANS[-1]) / BASE_BLOCK_S) + 1)
        self._block = (0, 0.0)  # (bins in it, their sum)
        # (second, rate, rate), decreasing, and (second, excess, its rate): see remember
        self.rates: deque[tuple[int, float, float]] = deque()
        self.excess: deque[tuple[int, float, float]] = deque()  # of recurring bursts
        self.first: deque[tuple[int, float, float]] = deque()  # of a first burst
        self.recurrence = Recurrence(config)
        self._minutes = 0  # whole minutes of arrivals seen (blocks made)
        self._pruned = 0  # ... when the excess was last pruned of levels

    def add(self, arrived: float) -> None:
        """One bin's arrived work, into the minute being filled."""
        block = self.config.bins(BASE_BLOCK_S)
        n, total = self._block
        self._block = (n + 1, total + arrived)
        if n + 1 == block:
            self._blocks.append((total + arrived) / block)
            self._block = (0, 0.0)
            self._minutes += 1

    def clear(self) -> None:
        """Forget the history (a long gap: what came before says nothing about now)."""
        self.rates.clear()
        self.excess.clear()
        self.first.clear()
        self.recurrence.clear()
        self._blocks.clear()
        self._block = (0, 0.0)

    def term(self, now_rate: float, second: int, first_s: float,
             lead: float) -> tuple[float, float]:
        """(the burst term before the capacity, the excess it holds), with the load's
        level at ``now_rate``: every burst's excess for ``first_s``; a recurring burst's
        for ``memory_s`` - or, for bursts at a period, from ``lead`` before the next is
        due (``recurrence``)."""
        c = self.config
        recent = second - c.bins(min(first_s, c.memory_s))
        rate = self.rates[0][1] if self.rates else 0.0
        excess = max((e[1] for e in (*self.excess, *self.first) if e[0] > recent),
                     default=0.0)
        due = self.recurrence.due(second, lead)
        if due is None:
            excess = max(excess, faded(self.excess, second, c.bins(c.memory_s)))
        else:
            excess, rate = max(excess, due[0]), max(rate, due[1])
        return min(rate, now_rate + excess), excess

    def remember(self, second: int, arrived: Window, delay: float, first_s: float) -> None:
        """Remember this second's burst rate over ``arrived`` and its excess: for
        ``memory_s`` when the workload has burst as much before, else ``first_s``."""
        c = self.config
        spans = [span for span in BURST_SPANS if span <= c.burst_s]
        # The objective is a percentile per minute: a minute may have ``late_share`` of
        # its work (its requests, at their mean size) wait past the budget. Work W that
        # arrives over L at a server of rate c leaves W - c(L + D) over the bound, and of
        # it the share that waits late is W / (W - cL) times that (arrivals at the span's
        # rate keep coming while the queue stands; an instant clump: 1x); allowing ``a`` of
        # late work, c = (W - a) / (L + D - aL/W). A clump whose overflow the percentile
        # absorbs is no burst; sustained excess barely changes (aL/W ~ a/rate is small).
        allowed = c.late_share * arrived.last(c.bins(BASE_BLOCK_S)) * c.resolution_s
        rate = 0.0
        for span in spans:
            work = arrived.last(c.bins(span)) * c.resolution_s
            if work > allowed:
                rate = max(rate, (work - allowed) / (span + delay - allowed * span / work))
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
            self.excess = deque(e for e in self.excess if level < LEVEL_SHARE * e[2])
            self.first = deque(e for e in self.first if level < LEVEL_SHARE * e[2])
        bucket, memory = c.bins(BURST_BUCKET_S), c.bins(c.memory_s)
        remember(self.rates, second, rate, rate, bucket, memory)
        recurs = self.recurrence.see(second, excess, rate) if blocks else True
        remember(self.excess if recurs else self.first, second, excess, rate, bucket,
                 memory)
        for entries, span in ((self.excess, memory),
                              (self.first, c.bins(min(first_s, c.memory_s)))):
            while entries and entries[0][0] <= second - span:
                entries.popleft()


def faded(entries: Iterable[tuple[int, float, float]], second: int, span: int) -> float:
    """The largest remembered excess of ``entries`` (second seen, excess, rate) at
    ``second``, in a memory of ``span`` bins: each held whole for ``WHOLE_SHARE`` of it,
    then less in a straight line to nothing at its end (inline: it runs every second
    over every entry)."""
    whole = WHOLE_SHARE * span
    young, gone, fall = second - whole, second - span, span - whole
    return max((value if when >= young else value * (when - gone) / fall if when > gone
                else 0.0 for when, value, _ in entries), default=0.0)


def remember(memory: deque[tuple[int, float, float]], second: int, value: float,
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
