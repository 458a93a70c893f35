"""A model of KEDA's part of the loop for one ScaledObject (below the HPA).

KEDA polls its scalers every ``pollingInterval``. With replicas at zero only activation
matters: any trigger active -> scale to max(minReplicaCount, 1). Above zero the HPA decides
(its minimum is max(minReplicaCount, 1)), except that KEDA scales to zero once no trigger
has been active for ``cooldownPeriod`` (and not before ``initialCooldownPeriod`` after
creation) when minReplicaCount is 0. When a scaler has failed more than ``failureThreshold``
polls in a row and a fallback is set, the workload runs ``fallback.replicas``. An ``external-push``
trigger that pushes ``true`` activates at once; a pushed ``false`` does nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuscale.kube.replies import int_at, obj_at, str_at
from gpuscale.models.hpa import SCALE_DOWN, SCALE_UP, Hpa, Metric, Rules


@dataclass(frozen=True, slots=True)
class ScaledObjectSpec:
    polling_s: float = 30.0
    cooldown_s: float = 300.0
    initial_cooldown_s: float = 0.0
    min_replicas: int = 0
    max_replicas: int = 100
    fallback_replicas: int | None = None
    failure_threshold: int = 3
    fallback_behavior: str = "static"  # KEDA's fallback.behavior
    target_kind: str = "Deployment"  # scaleTargetRef
    target_name: str = ""
    behavior_json: str = ""  # advanced.horizontalPodAutoscalerConfig.behavior, as JSON

    @property
    def hpa_min(self) -> int:
        return max(self.min_replicas, 1)


def scaled_object_spec(spec: Mapping[str, Any]) -> ScaledObjectSpec:
    """A ScaledObject's ``spec`` (JSON, as the API returns it) with KEDA's defaults for
    what it leaves out. Fields of the wrong JSON type read as absent."""
    base = ScaledObjectSpec()
    fallback = obj_at(spec, "fallback")
    behavior = obj_at(spec, "advanced", "horizontalPodAutoscalerConfig", "behavior")
    return ScaledObjectSpec(
        polling_s=float(int_at(spec, "pollingInterval", default=int(base.polling_s))),
        cooldown_s=float(int_at(spec, "cooldownPeriod", default=int(base.cooldown_s))),
        initial_cooldown_s=float(int_at(spec, "initialCooldownPeriod", default=0)),
        min_replicas=int_at(spec, "minReplicaCount", default=base.min_replicas),
        max_replicas=int_at(spec, "maxReplicaCount", default=base.max_replicas),
        fallback_replicas=int_at(spec, "fallback", "replicas", default=-1) if fallback
        else None,
        failure_threshold=int_at(spec, "fallback", "failureThreshold",
                                 default=base.failure_threshold),
        fallback_behavior=str_at(spec, "fallback", "behavior")[:64] or base.fallback_behavior,
        target_kind=str_at(spec, "scaleTargetRef", "kind") or base.target_kind,
        target_name=str_at(spec, "scaleTargetRef", "name"),
        behavior_json=json.dumps(behavior, sort_keys=True)[:16384] if behavior else "")


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
            # KEDA counts this failure first, then falls back when the count is above the
            # threshold (pkg/fallback/fallback.go, GetMetricsWithFallback:
            # `*healthStatus.NumberOfFailures > scaledObject.Spec.Fallback.FailureThreshold`).
            if s.fallback_replicas is not None and self.failures > s.failure_threshold:
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


HPA_SYNC_S = 15.0  # the HPA controller's --horizontal-pod-autoscaler-sync-period


class ScaledObjectLoop:
    """KEDA and the HPA it creates, together, for one ScaledObject: KEDA polls IsActive every
    ``pollingInterval`` and owns 0 <-> 1; the HPA syncs every 15 s above zero. The caller
    reads the scaler (in-process for ``simulate``, over gRPC for the live demo) when
    ``due`` says a poll or a sync is coming, then calls ``decide``."""

    def __init__(self, spec: ScaledObjectSpec, scale_up: Rules = SCALE_UP,
                 scale_down: Rules = SCALE_DOWN) -> None:
        """``scale_up``/``scale_down``: the HPA's behavior (KEDA's
        advanced.horizontalPodAutoscalerConfig.behavior); Kubernetes' defaults."""
        self.keda = Keda(spec)
        self.hpa = Hpa(spec.hpa_min, spec.max_replicas, scale_up, scale_down)
        self._last_poll: float | None = None
        self._last_sync = -HPA_SYNC_S
        self.reason = ""  # why the last change happened

    def warm(self, now: float, replicas: int) -> None:
        """The loop has been running at ``replicas`` before ``now`` (a simulation window
        that opens on a running system): the HPA's scale-down window remembers that count,
        instead of a fresh HPA's empty history, which would scale down at once."""
        self.hpa.remember(now, replicas)

    def due(self, now: float, replicas: int) -> bool:
        return self.keda.due(now, self._last_poll) or (
            replicas > 0 and now - self._last_sync >= HPA_SYNC_S)

    def decide(self, now: float, replicas: int, ready: int, metrics: Sequence[Metric],
               active: bool | None) -> int:
        """The replica count after this moment's poll and sync (``active`` None: the
        scaler answered with an error)."""
        desired = replicas
        if self.keda.due(now, self._last_poll):
            self._last_poll = now
            set_to = self.keda.poll(now, replicas, active)
            if set_to is not None:
                desired = set_to
                self.reason = f"KEDA: {self.keda.reason}"
        if desired == replicas and replicas > 0 and now - self._last_sync >= HPA_SYNC_S:
            self._last_sync = now
            desired = self.hpa.step(now, replicas, metrics, ready)
            if desired != replicas:
                self.reason = f"HPA: {self.hpa.last_reason}"
        return desired
