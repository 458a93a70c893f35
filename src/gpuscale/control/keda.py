"""A model of KEDA's part of the loop for one ScaledObject (below the HPA).

KEDA polls its scalers every ``pollingInterval``. With replicas at zero only activation
matters: any trigger active -> scale to max(minReplicaCount, 1). Above zero the HPA decides
(its minimum is max(minReplicaCount, 1)), except that KEDA scales to zero once no trigger
has been active for ``cooldownPeriod`` (and not before ``initialCooldownPeriod`` after
creation) when minReplicaCount is 0. When a scaler keeps failing for ``failureThreshold``
polls and a fallback is set, the workload runs ``fallback.replicas``. An ``external-push``
trigger that pushes ``true`` activates at once; a pushed ``false`` does nothing.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ScaledObjectSpec:
    polling_s: float = 30.0
    cooldown_s: float = 300.0
    initial_cooldown_s: float = 0.0
    min_replicas: int = 0
    max_replicas: int = 100
    fallback_replicas: int | None = None
    failure_threshold: int = 3

    @property
    def hpa_min(self) -> int:
        return max(self.min_replicas, 1)


class Keda:
    def __init__(self, spec: ScaledObjectSpec, created_at: float = 0.0) -> None:
        self.spec = spec
        self._created = created_at
        self._last_active: float | None = None
        self.failures = 0
        self.reason = ""

    def due(self, now: float, last_poll: float | None) -> bool:
        return last_poll is None or now - last_poll >= self.spec.polling_s

    def poll(self, now: float, current: int, active: bool | None) -> int | None:
        """One poll; ``active`` None means the scaler answered with an error. Returns the
        replica count KEDA sets, or None when it leaves the count to the HPA."""
        s = self.spec
        if active is None:
            self.failures += 1
            if s.fallback_replicas is not None and self.failures >= s.failure_threshold:
                self.reason = f"scaler failing {self.failures} polls: fallback"
                return s.fallback_replicas
            self.reason = f"scaler failed ({self.failures}/{s.failure_threshold})"
            return None
        self.failures = 0
        if active:
            self._last_active = now
            if current == 0:
                self.reason = "activated from zero"
                return min(s.max_replicas, s.hpa_min)
            return None
        if current > 0 and s.min_replicas == 0:
            since = now - (self._last_active if self._last_active is not None
                           else self._created)
            if since >= s.cooldown_s and now - self._created >= s.initial_cooldown_s:
                self.reason = f"inactive for {since:.0f}s: to zero"
                return 0
        return None

    def push(self, now: float, current: int, active: bool) -> int | None:
        """An external-push message: only ``true`` acts, at once."""
        return self.poll(now, current, True) if active else None
