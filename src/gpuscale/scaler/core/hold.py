"""The planner's scale-down hold (``scaler.core.planner``): the count kept from the last
``hold_s`` (a start-up by default: capacity given back that is needed again within a
start-up costs a cold start of missed SLO).

Two parts. The terms other than the load's (the running sequences and KV the arrivals
sustain, a burst whose memory is shorter than the hold) are held as they were: the largest
count of the window. The **load** (its work with room) is held less the fall it has shown
since, while it falls smoothly (``smooth_fall``): the least-squares slopes of the last
``TREND_S`` and of its last half both falling, neither more than ``FALL_AGREE`` times the
other; the smaller is the fall. The work seen ``a`` bins ago then counts as that work less
``a`` x the fall, and what the fall let go stays let go (only the work of the bin itself
raises it again: the fall wavers with the load's noise, and the past coming back would ask
for a replica it had just given up).

- A smooth decline (the evening side of a day, the end of a ramp) is held at about its
  level now: what it left behind is not coming back within a start-up. The hold of the
  window's own counts kept 5 replicas 5 minutes past the peak of ``diurnal``.
- A dip in a noisy load keeps the count of the level around it: the work of a minute ago
  stands above the fitted line by the noise (the shipped trace x8: 3.1 replicas of work
  falling to 2.5 over 5 minutes and back 2 minutes later keeps its 4 replicas).
- A step down is held while its last half window falls more than twice as fast as the
  whole (its first ~100 s with a 300-s ``TREND_S``); about 2 minutes after it the two agree
  for a few tens of seconds, and the part of the old level the fall reaches in that time
  is let go - for good, as any fall. A step that comes back 2-5 minutes later then meets
  fewer replicas than the whole hold kept (none of the benchmark's loads did; measured
  with the whole fall required to last 60 s, which holds a step, the benchmark's loads
  gave back most of what this saves: trace x8 4.64 -> 4.76 GPU-hours, ``steps`` 3.28 ->
  3.50).

Measured (``bench/bench_planner_alone.py``, 2026-11-28, against the hold of the window's
own counts): the 24 benchmark loads 125.26 -> 122.30 GPU-hours at 75 -> 76 SLO minutes
(``long-prompt-bursts`` seed 1, 15 -> 16), the 12 fresh ones 66.72 -> 64.80 at 21 -> 21;
``diurnal`` 3.73 -> 3.50, ``ramp`` 3.47 -> 3.20, trace x8 4.75 -> 4.64, ``steps`` -6 %. The
load's slopes alone, without the agreement, let go of a wavering ``noisy-diurnal`` (2 -> 4
minutes on seed 1).

The load's work is kept per ``BUCKET_S`` (its largest, at the bin it was seen; a bucket
leaves once all of its bins have), so a hold costs at most ``hold_s / BUCKET_S`` entries,
scanned only while the load falls; otherwise the window's largest work is the first of
the buckets' largest kept decreasing (as the hold of the window's own counts kept them),
so a second costs about what it did before while the load does not fall.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

from gpuscale.scaler.core.windows import Window

BUCKET_S = 10  # the load's work is kept per this many bins (its largest in each)
FALL_AGREE = 2.0  # a smooth fall: TREND_S's slope and its last half's within this factor


def smooth_fall(window: Window, n: int) -> float:
    """The fall per bin (>= 0) of ``window``'s last ``n`` values when it is smooth: the
    smaller of the least-squares falls over ``n`` and over ``n // 2`` when both fall and
    neither is more than ``FALL_AGREE`` times the other; else 0."""
    whole, half = -window.slope(n), -window.slope(n // 2)
    if whole <= 0 or half <= 0 or max(whole, half) > FALL_AGREE * min(whole, half):
        return 0.0
    return min(whole, half)


class Hold:
    """One workload's hold: the counts and the load's work of the last ``hold`` bins."""

    def __init__(self) -> None:
        self._counts: deque[tuple[int, int]] = deque()  # (bin, count), decreasing
        self._work: deque[tuple[int, float]] = deque()  # (bin, largest work in its bucket)
        self._peaks: deque[tuple[int, float]] = deque()  # (bin, work) of _work, decreasing
        self._kept: float | None = None  # the load's work held at the last bin

    def clear(self) -> None:
        self._counts.clear()
        self._work.clear()
        self._peaks.clear()
        self._kept = None

    def keep(self, second: int, hold: int, other: int, work: float, fall: float,
             count: Callable[[float], float]) -> int:
        """The count the hold keeps at ``second`` (a bin): the largest ``other`` count of
        the last ``hold`` bins, and ``count`` (replicas with room) of the largest work of
        those bins less ``fall`` (work per bin, >= 0) per bin since it was seen. Records
        this bin's ``other`` and ``work`` first."""
        while self._counts and self._counts[-1][1] <= other:
            self._counts.pop()
        self._counts.append((second, other))
        while self._counts[0][0] <= second - hold:
            self._counts.popleft()
        if self._work and self._work[-1][0] // BUCKET_S == second // BUCKET_S:
            if work >= self._work[-1][1]:
                self._work[-1] = (second, work)
        else:
            self._work.append((second, work))
        # (a bucket leaves once all of its bins have: never held shorter than ``hold``)
        while self._work and (self._work[0][0] // BUCKET_S + 1) * BUCKET_S <= second - hold:
            self._work.popleft()
        # The buckets' largest works, decreasing: the first is the window's largest.
        while self._peaks and self._peaks[-1][1] <= work:
            self._peaks.pop()
        if not self._peaks or self._peaks[-1][0] // BUCKET_S != second // BUCKET_S:
            self._peaks.append((second, work))
        while (self._peaks[0][0] // BUCKET_S + 1) * BUCKET_S <= second - hold:
            self._peaks.popleft()
        if fall > 0:  # (the scan only while the load falls; else the window's largest)
            kept = max(w - fall * (second - at) for at, w in self._work)
        else:
            kept = self._peaks[0][1]
        # What the fall let go stays let go: only this second's work raises it again
        # (the fall wavers with the load's noise; the past coming back would flap).
        if self._kept is not None:
            kept = min(kept, self._kept)
        self._kept = kept = max(kept, work)
        load = count(kept)
        return max(self._counts[0][1], math.ceil(load - 1e-9) if load > 0 else 0)
