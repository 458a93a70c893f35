"""The planner's forecast (``scaler.core.planner``): how much the load and the KV cache's
fill grow over one start-up, and how fast the load falls.

A replica asked for now serves the load of a start-up from now, so the steady and kv
terms plan for the growth a start-up ahead. The growth per second is the smaller of the
least-squares slopes of the last ``TREND_S`` seconds and of their last half, when both
are positive: a load or a cache that stopped rising half a window ago (a step, a ramp that
ended) has none. Over a start-up it is at most ``TREND_CAP`` of the load (``KV_TREND_CAP``
of the cache's use): a slope read off minutes is no licence to plan several times what
runs. The load's growth waits for a whole ``TREND_S`` (a shorter slope of arrived work
chases its lumps); the cache's fill is read from ``KV_TREND_MIN_S`` seen (long
generations fill it for minutes while the work per second stays low, and a planner that
has just started meets a workload ramping in). Neither with the trigger's ``trend`` off,
and no load growth while a recurring burst is expected (``recurrence``: its excess is held
ahead of it; its rise is no trend).

The forecast growth is planned for while it lasts, not held - but a replica asked for it
is not cancelled while it starts as long as the growth was seen within the steady window
(``Kept``): the two slopes waver around 0 on a load that rises in fits, and a pod asked,
cancelled (a ReplicaSet deletes pods that are not Ready first) and asked again a minute
later starts from nothing. Measured on the shipped trace x2 and x4 (minute 20-23: asked at
20, cancelled at 21, asked again at 22 and Ready at 24, a missed minute on each) and over
the benchmark (``bench/bench_planner_alone.py --draws 4``, 2026-12-07, means of 4 draws):
24 loads 122.64 -> 123.16 GPU-hours at 80.5 -> 78.2 SLO minutes, 12 fresh ones 65.14 ->
65.48 at 25.2 -> 24.2 - about half of what the ``utilization`` knob pays a minute (0.85 ->
0.8: +2.2 GPU-hours for 4). Kept 30 s: 79.0 / 25.0 minutes; 120 s: as 60 s, at more GPU-hours.
Keeping any asked pod while it starts (not only the growth's) cost 3 % more GPU-hours:
the burst term's asks are many pods at a burst's onset.

The fall (``hold.smooth_fall``) is what lets the hold give back a smooth decline.
"""

from __future__ import annotations

from collections import deque

from gpuscale.scaler.core.hold import smooth_fall
from gpuscale.scaler.core.plan_values import PlannerConfig
from gpuscale.scaler.core.windows import Window

TREND_S = 300  # the load's growth is the least-squares slope over this window
TREND_CAP = 0.5  # growth planned for over a start-up, at most this fraction of the load
KV_TREND_CAP = 0.5  # the KV cache's fill planned for, at most this fraction of its use
KV_TREND_MIN_S = 120  # the cache's fill is read once this is seen (the load's: TREND_S)


def growth(config: PlannerConfig, window: Window, least_s: int = TREND_S) -> float:
    """Growth per second of ``window``'s values (>= 0): the smaller of the least-squares
    slopes of the last ``TREND_S`` and of its last half. Under ``TREND_S`` seen: over
    what was, from ``least_s`` on; none before."""
    n = min(config.bins(TREND_S), len(window.values))
    if n < config.bins(least_s):
        return 0.0
    return max(0.0, min(window.slope(n), window.slope(n // 2))) / config.resolution_s


def load_growth(config: PlannerConfig, arrived: Window, startup: float, load: float,
                expected: bool) -> float:
    """The load's growth over ``startup`` (replica-seconds/s): none before a whole
    ``TREND_S``, without ``trend`` or while a recurring burst is ``expected``; at most
    ``TREND_CAP`` of ``load``."""
    if not config.trend or expected or len(arrived.values) < config.bins(TREND_S):
        return 0.0
    return min(growth(config, arrived) * startup, TREND_CAP * load)


def kv_growth(config: PlannerConfig, kv: Window, startup: float, use: float) -> float:
    """The KV cache's fill over ``startup`` (percent points summed over Ready pods), read
    from ``KV_TREND_MIN_S`` seen; at most ``KV_TREND_CAP`` of its ``use``."""
    if not config.trend:
        return 0.0
    return min(growth(config, kv, KV_TREND_MIN_S) * startup, KV_TREND_CAP * use)


def fall(config: PlannerConfig, arrived: Window) -> float:
    """The load's smooth fall per bin (``hold.smooth_fall``); none until a whole
    ``TREND_S`` is seen, or without ``trend``."""
    n = config.bins(TREND_S)
    if not config.trend or len(arrived.values) < n:
        return 0.0
    return smooth_fall(arrived, n)


class Kept:
    """The largest load growth of the last bins (a decreasing deque: O(1) a bin)."""

    def __init__(self) -> None:
        self._seen: deque[tuple[int, float]] = deque()  # (bin, growth), decreasing

    def clear(self) -> None:
        self._seen.clear()

    def keep(self, second: int, bins: int, growth: float) -> float:
        """Records ``growth`` at ``second`` (a bin) and answers the largest of the last
        ``bins``."""
        while self._seen and self._seen[-1][1] <= growth:
            self._seen.pop()
        self._seen.append((second, growth))
        while self._seen[0][0] <= second - bins:
            self._seen.popleft()
        return self._seen[0][1]
