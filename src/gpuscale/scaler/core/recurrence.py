"""Whether a workload's bursts recur, and when the next is due (``scaler.core.bursts``).

A **burst** is a stretch of seconds whose excess over the level is at least
``BURST_SHARE`` of its rate (less is a level's noise), ended by ``EPISODE_GAP_S`` without
one at half its largest; its tail (excess left while the spans still hold it) is no new
burst until the excess has fallen to nothing once. It **recurs** when another burst of at
least ``RECUR_SHARE`` of its excess came within ``RECUR_S`` before it: only then is its
excess worth remembering for ``memory_s`` (a one-off burst held for 20 minutes is 20
minutes of its replicas for nothing; a first burst is kept a hold). The last two large
bursts (at least ``RECUR_SHARE`` of the largest) give a **period** - once there are
``PERIODS`` gaps between them, only when those agree within ``REGULAR_SHARE`` (bursts at
random times then have none, and the memory holds for them): the next is due one period
after the last one's onset, and its excess is held from a start-up (``lead``) and the
jitter before that until the jitter after, not in between; while it goes on its rise is
no trend to plan growth from (its size is known). A due burst that does not come ends
the period (the memory holds what it still holds, as for bursts at no period).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from itertools import pairwise

from gpuscale.scaler.core.plan_values import PlannerConfig

EPISODE_GAP_S = 60  # this long without excess at half its largest ends a burst
BURST_SHARE = 1 / 3  # excess below this share of its burst rate is noise, no burst
RECUR_S = 3600  # a burst recurs when another came within this before it ...
RECUR_SHARE = 0.5  # ... whose excess was at least this share of its own
PERIODS = 2  # two bursts give a period (as the onset bench's learned row assumes); once
#   there are this many gaps between large bursts, only when they agree ...
REGULAR_SHARE = 0.15  # ... within this share of the longer
JITTER_SHARE = 0.05  # a burst is due within this share of the period (or as the gaps vary)
MAX_EPISODES = 64  # bursts kept (the oldest go first; a minute apart at least)


@dataclass(frozen=True, slots=True)
class Episode:
    """One burst: its onset (the second it rose to within ``RECUR_SHARE`` of its largest
    excess so far: a trickle of excess before a burst does not move when it came), its
    last second with excess, the onset's excess, its largest excess and that one's rate."""

    start: int
    last: int
    onset_excess: float
    excess: float
    rate: float


class Recurrence:
    """One workload's bursts within ``RECUR_S``, the one going on, and their period."""

    def __init__(self, config: PlannerConfig) -> None:
        self.config = config
        self._ended: deque[Episode] = deque(maxlen=MAX_EPISODES)
        self._now: Episode | None = None
        # The excess fell to nothing since the last burst ended (its tail is no burst)
        self._quiet = True
        # (period s, its spread, the last large burst's onset, excess, rate): _period
        self.period: tuple[int, int, int, float, float] | None = None

    def clear(self) -> None:
        self._ended.clear()
        self._now = None
        self._quiet = True
        self.period = None

    def see(self, second: int, excess: float, rate: float) -> bool:
        """This second's ``excess`` (of burst ``rate``), in the burst going on or starting
        one: whether the burst going on recurs (no burst, or a tail of excess left after
        one: it does not)."""
        c = self.config
        if excess < BURST_SHARE * rate:
            excess = 0.0
        now = self._now
        if now is not None and second - now.last > c.bins(EPISODE_GAP_S):
            self._ended.append(now)
            now, self._quiet = None, False
            self.period = self._period()
        self._quiet = self._quiet or excess <= 0
        if now is None and excess > 0 and self._quiet:
            now = Episode(second, second, excess, excess, rate)
        elif now is not None and excess > now.excess:
            now = (Episode(now.start, second, now.onset_excess, excess, rate)
                   if now.onset_excess >= RECUR_SHARE * excess else
                   Episode(second, second, excess, excess, rate))
        elif now is not None and excess >= RECUR_SHARE * now.excess:
            now = Episode(now.start, second, now.onset_excess, now.excess, now.rate)
        self._now = now
        while self._ended and self._ended[0].start <= second - c.bins(RECUR_S):
            self._ended.popleft()
        return now is not None and any(e.excess >= RECUR_SHARE * now.excess
                                       for e in self._ended)

    def _period(self) -> tuple[int, int, int, float, float] | None:
        """(the period, how much its gaps vary, the last large burst's onset, the excess
        and rate to hold for the next): the gap between the last two large bursts - once
        there are ``PERIODS`` gaps, only when they agree."""
        if not self._ended:
            return None
        top = max(e.excess for e in self._ended)
        large = [e for e in self._ended if e.excess >= RECUR_SHARE * top][-PERIODS - 1:]
        if len(large) < 2:
            return None
        gaps = [b.start - a.start for a, b in pairwise(large)]
        if max(gaps) - min(gaps) > REGULAR_SHARE * max(gaps):
            return None
        return (max(gaps), max(gaps) - min(gaps), large[-1].start,
                max(e.excess for e in large), max(e.rate for e in large))

    @property
    def expected(self) -> bool:
        """A burst is going on that came at its period (its size is known: its rise is no
        trend to extrapolate)."""
        now = self._now
        return (self.period is not None and now is not None
                and now.excess >= RECUR_SHARE * self.period[3])

    def due(self, second: int, lead: float) -> tuple[float, float] | None:
        """Regular bursts: (the excess, its rate) to hold now - (0, 0) between them, the
        largest of the last ones from ``lead`` and the jitter before the next is due until
        the jitter after. None when there is no period (or the due burst did not come)."""
        if self.period is None:
            return None
        period, spread, last, excess, rate = self.period
        if self.expected:
            return excess, rate  # the burst that was due, going on: held until it ends
        c = self.config
        jitter = max(spread, JITTER_SHARE * period)
        due = last + period
        if second > due + c.bins(jitter):
            return None
        if second < due - c.bins(lead + jitter):
            return 0.0, 0.0
        return excess, rate
