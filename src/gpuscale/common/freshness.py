"""The one staleness rule: how old a reading may be before it no longer counts.

A reading is fresh for three of its producer's intervals (one late tick, and one lost,
still leave it counted), and never less than two seconds (a fast cadence must not make
scheduling jitter look like a dead agent). The agent's readiness, the scaler's fleet view
(per pod, from the interval each agent announces) and the demos all apply this bound.
"""

from __future__ import annotations

STALE_AFTER_INTERVALS = 3.0
MIN_STALE_S = 2.0


def staleness_bound(interval_s: float) -> float:
    """Seconds after which a reading made every ``interval_s`` seconds is stale."""
    return max(STALE_AFTER_INTERVALS * interval_s, MIN_STALE_S)
