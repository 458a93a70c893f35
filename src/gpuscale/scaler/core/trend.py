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

The fall (``hold.smooth_fall``) is what lets the hold give back a smooth decline.
"""

from __future__ import annotations

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
