"""The one staleness rule: how old a reading may be before it no longer counts.

A reading is fresh for three of its producer's intervals (one late tick, and one lost,
still leave it counted), and never less than two seconds (a fast cadence must not make
scheduling jitter look like a dead agent). Each producer is judged by its own bound: an
agent's readings, its node's devices and its pods' records by the bound of the interval
that agent announces (``staleness_bound``); the scaler's default applies only to what
names no interval. The agent's readiness and engine scrapes, the scaler's answers (per
pod), its recorder and the Inspect service (per node), ``top`` and ``explain`` all judge
with ``is_stale``.

Two limits are not readings' freshness and are named here so they are read beside it:
the planner's (``PLAN_STALE_S``: no usable observation for this long and its plan answers
UNAVAILABLE - a plan outlives a few lost ticks, not a dead workload) and the pod watch's
(``POD_LIST_STALE_S``: how long the last listed pods stand in for a watch that is down -
pods change far more slowly than readings, and relisting thousands of them costs the API
server).
"""

from __future__ import annotations

import math

STALE_AFTER_INTERVALS = 3.0
MIN_STALE_S = 2.0
# The longest any reading counts: an agent announcing a huge (finite) interval would
# otherwise keep a node gone quiet answering OK for as long as it claimed. 300 s covers a
# deliberate slow cadence (an interval up to 100 s); nothing slower can feed an autoscaler.
MAX_STALE_S = 300.0
PLAN_STALE_S = 10.0  # scaler.core.planner: a plan without a usable observation this long
POD_LIST_STALE_S = 120.0  # scaler.sources.roster: the last listed pods stand in this long


def staleness_bound(interval_s: float) -> float:
    """Seconds after which a reading made every ``interval_s`` seconds is stale. An
    interval that is not a positive finite number (a broken or hostile peer's) gets the
    shortest bound, and no interval gives more than MAX_STALE_S: it must not make its
    readings count for ever."""
    if not math.isfinite(interval_s) or interval_s <= 0:
        return MIN_STALE_S
    return min(max(STALE_AFTER_INTERVALS * interval_s, MIN_STALE_S), MAX_STALE_S)


def is_stale(age_s: float, bound_s: float) -> bool:
    """Whether something ``age_s`` seconds old is past ``bound_s`` (its producer's bound,
    or one of the limits above). Exactly at the bound still counts."""
    return age_s > bound_s


def bound_of(own_s: float, default_s: float) -> float:
    """A producer's own bound (seconds; 0: it named none), else the receiver's default."""
    return own_s if own_s > 0 else default_s
