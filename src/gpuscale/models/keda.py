"""A model of KEDA's part of the loop for one ScaledObject (below the HPA), as KEDA v2.21.0
does it; the Go function each rule comes from is named where it is applied.

- KEDA's scale loop polls every ``pollingInterval`` (scale_handler.go, checkScalers). For an
  external scaler one observation of a metric is GetMetrics then IsActive
  (external_scaler.go, GetMetricsAndActivity); after an error KEDA rebuilds the scaler and
  tries once more (scalers_cache.go, GetMetricsAndActivityForScaler: ``SCALER_ATTEMPTS``).
  The HPA's reads, every sync while replicas > 0, are the same observation through KEDA's
  metrics server (GetScaledObjectMetrics): ``Keda.observe`` is both.
- Fallback (fallback.go, GetMetricsWithFallback): with a valid ``spec.fallback`` every failed
  observation - a poll's and an HPA read's alike - counts one failure of that metric, and a
  success resets it. Once the count is above ``failureThreshold`` the metric answers what
  makes the fallback's count desired (doFallback: count x target, or count / ready pods x
  target for Value) and counts as active, without error. KEDA does not set the replicas
  itself: the HPA reaches the count through its tolerance, stabilization and rate limits.
- RequestScale (scale_scaledobjects.go): active at 0 -> max(minReplicaCount, 1); active
  above 0 -> lastActiveTime is now (not while another metric fails); inactive with
  minReplicaCount 0 -> 0 once lastActiveTime + cooldownPeriod has passed or, never active,
  creation + initialCooldownPeriod (cooldownPeriod does not apply then) - not while a
  metric fails, unless the fallback is of 0 replicas; inactive below minReplicaCount ->
  minReplicaCount.
- Pods metrics (KEDA's cpu and memory triggers) do not pass through KEDA; with only those a
  ScaledObject is always active (getScaledObjectState).
- A poll of a ScaledObject with minReplicaCount > 0 uses the HPA's last observation instead
  of its own while the HPA's ScalingActive is True (UsesHPAObservations,
  hpaActivelyQuerying): it counts no failure then.
- external-push (startPushScalers): a pushed ``true`` is RequestScale(active) at once; a
  pushed ``false`` does nothing.

Not modelled: idleReplicaCount, useCachedMetrics, scalingModifiers, paused annotations.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuscale.kube.replies import int_at, obj_at, str_at
from gpuscale.models.hpa import Hpa, Metric, MetricSource, Rules, TargetType, parse_behavior

SCALER_ATTEMPTS = 2  # a failed GetMetricsAndActivity is tried once more on a new scaler
HPA_SYNC_S = 15.0  # the HPA controller's --horizontal-pod-autoscaler-sync-period
FALLBACK_BEHAVIORS = ("static", "currentReplicas", "currentReplicasIfHigher",
                      "currentReplicasIfLower")


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

    @property
    def has_fallback(self) -> bool:
        """A fallback KEDA acts on (HasValidFallback: replicas and threshold >= 0)."""
        return (self.fallback_replicas is not None and self.fallback_replicas >= 0
                and self.failure_threshold >= 0)

    @property
    def uses_hpa_observations(self) -> bool:
        """UsesHPAObservations: pollingInterval is not relevant (minReplicaCount > 0)."""
        return self.min_replicas > 0


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


def builtin_active(metrics: Sequence[Metric]) -> bool | None:
    """IsActive of a scaler built into KEDA (prometheus, the per-node GPU scaler), which
    compares its one value with ``activationThreshold`` - 0 by default, as the baselines
    configure it: active when a value is above 0; None (an error) when every value
    failed. Pods metrics (the cpu and memory triggers) are ``observe``'s to judge.
    gpuscale's own triggers are not judged here: scaler.answers.activity is their rule."""
    values = [m.value for m in metrics if m.kind is not MetricSource.PODS]
    if values and all(v is None for v in values):
        return None
    return any(v is not None and v > 0.0 for v in values)


def fallback_count(behavior: str, replicas: int, current: int) -> int:
    """The count a fallback stands for (doFallback, fallback.behavior): ``current`` is the
    target's spec.replicas; static - the default, and what an unknown behavior reads as -
    is ``replicas``."""
    if behavior == "currentReplicas":
        return current
    if behavior == "currentReplicasIfHigher":
        return max(current, replicas)
    if behavior == "currentReplicasIfLower":
        return min(current, replicas)
    return replicas


def fallback_value(count: int, metric: Metric, ready: int) -> float | None:
    """The value KEDA gives the HPA for a metric that falls back to ``count`` replicas
    (doFallback): count x target for AverageValue, count / ``ready`` (the target's Ready
    pods) x target for Value - None, an error, when none is Ready - in whole thousandths,
    truncated (NewMilliQuantity(int64(target x 1000 x count)))."""
    replicas = float(count)
    if metric.target_type is TargetType.VALUE:
        if ready <= 0:
            return None
        replicas /= ready
    return int(metric.target * 1000 * replicas) / 1000


@dataclass(frozen=True, slots=True)
class Observation:
    """One observation of every metric through KEDA (a poll's or an HPA read's)."""

    metrics: tuple[Metric, ...]  # what the HPA gets: the scaler's value, a fallback's,
    #   or None (an error)
    active: bool  # some metric active, or falling back (getScalerState)
    error: bool  # some metric failing without a fallback value
    fallback: bool  # some metric falling back


class Keda:
    """KEDA's scale loop and fallback for one ScaledObject created at ``created_at``."""

    def __init__(self, spec: ScaledObjectSpec, created_at: float = 0.0) -> None:
        self.spec = spec
        self._created = created_at
        self.last_active: float | None = None  # status.lastActiveTime
        self._failures: dict[int, int] = {}  # status.health: per metric, in a row
        self.fallback_active = False  # the Fallback condition, as of the last observation
        self.reason = ""

    @property
    def failures(self) -> int:
        """The longest run of failures of any metric (0 without a fallback: KEDA keeps
        no health then)."""
        return max(self._failures.values(), default=0)

    def due(self, now: float, last_poll: float | None) -> bool:
        return last_poll is None or now - last_poll >= self.spec.polling_s

    def observe(self, current: int, ready: int, metrics: Sequence[Metric],
                active: bool | None) -> Observation:
        """Each metric through GetMetricsWithFallback, once. ``active`` None: IsActive
        failed, and so every metric's observation; a metric's value None: its GetMetrics
        failed. No metrics: the trigger as one metric. Pods metrics (KEDA's cpu and memory
        triggers) do not pass through KEDA (getScalerState skips ``spec.External == nil``),
        and with only those the ScaledObject is always active (getScaledObjectState)."""
        s = self.spec
        out: list[Metric] = []
        any_active = error = fallback = False
        for i, m in enumerate(metrics or [None]):
            if m is not None and m.kind is MetricSource.PODS:
                out.append(m)
                continue
            if active is not None and (m is None or m.value is not None):
                if s.has_fallback:
                    self._failures[i] = 0
                any_active = any_active or active
                if m is not None:
                    out.append(m)
                continue
            value = None
            if s.has_fallback:
                self._failures[i] = self._failures.get(i, 0) + 1
                if self._failures[i] > s.failure_threshold:
                    assert s.fallback_replicas is not None
                    count = fallback_count(s.fallback_behavior, s.fallback_replicas, current)
                    value = float(count) if m is None else fallback_value(count, m, ready)
            if m is not None:
                out.append(Metric(m.kind, m.target_type, m.target, value))
            if value is None:
                error = True
            else:
                fallback = any_active = True
        if metrics and all(m.kind is MetricSource.PODS for m in metrics):
            any_active = True
        self.fallback_active = fallback
        return Observation(tuple(out), any_active, error, fallback)

    def settled(self, current: int, ready: int, metrics: Sequence[Metric],
                active: bool | None) -> Observation:
        """``observe`` once this moment has lasted: every failing metric has failed more
        than failureThreshold times in a row, so its fallback (if any) applies - what
        ``gpuscale explain`` shows ("assuming the fallback applies")."""
        s = self.spec
        if s.has_fallback:
            for i in range(max(1, len(metrics))):
                self._failures[i] = max(self._failures.get(i, 0), s.failure_threshold)
        return self.observe(current, ready, metrics, active)

    def poll(self, now: float, current: int, active: bool | None,
             metrics: Sequence[Metric] = (), ready: int | None = None,
             seen: Observation | None = None) -> int | None:
        """One poll: returns the replica count KEDA sets, or None when it leaves the count
        to the HPA. ``active`` None: the scaler answered IsActive with an error; ``ready``
        defaults to ``current``. ``seen``: the HPA's last observation, used instead of one
        of its own (UsesHPAObservations)."""
        if seen is None:
            seen = self.observe(current, current if ready is None else ready, metrics,
                                active)
        return self._request_scale(now, current, seen.active, seen.error)

    def push(self, now: float, current: int, active: bool) -> int | None:
        """An external-push message: only ``true`` acts, at once."""
        return self._request_scale(now, current, True, False) if active else None

    def _request_scale(self, now: float, current: int, active: bool,
                       error: bool) -> int | None:
        """RequestScale: the count KEDA sets, or None."""
        s = self.spec
        failing = f"scaler failing ({self.failures}/{s.failure_threshold})" \
            if s.has_fallback else "scaler failing (no fallback)"
        if active:
            if current == 0:
                self.last_active = now
                self.reason = "activated from zero" + \
                    (" (fallback)" if self.fallback_active else "")
                return s.hpa_min
            if error:
                self.reason = f"{failing}: lastActiveTime kept"
                return None
            self.last_active = now
            return None
        if error and (s.fallback_replicas is None or s.fallback_replicas != 0):
            self.reason = failing
            return None
        if current > 0 and s.min_replicas == 0:
            if self.last_active is None:
                since, wait = now - self._created, s.initial_cooldown_s
                what = "since creation (never active)"
            else:
                since, wait = now - self.last_active, s.cooldown_s
                what = "inactive"
            # ``>=``, where KEDA tests Before: lastActiveTime and the creation stamp are
            # stored in whole seconds (metav1.Time), so a poll that many seconds later is
            # past them.
            if since >= wait:
                self.reason = f"{what} for {since:.0f}s: to zero"
                return 0
            return None
        if current < s.min_replicas:
            self.reason = f"inactive below minReplicaCount: to {s.min_replicas}"
            return s.min_replicas
        return None


class ScaledObjectLoop:
    """KEDA and the HPA it creates, together, for one ScaledObject: KEDA polls every
    ``pollingInterval`` and owns 0 <-> 1; the HPA syncs every 15 s above zero, reading the
    metrics through KEDA (its fallback included). The caller reads the scaler (in-process
    for ``simulate``, over gRPC for the live demo) when ``due`` says a poll or a sync is
    coming, then calls ``decide``."""

    def __init__(self, spec: ScaledObjectSpec, scale_up: Rules | None = None,
                 scale_down: Rules | None = None) -> None:
        """``scale_up``/``scale_down``: the HPA's behavior; both None: the ScaledObject's
        advanced.horizontalPodAutoscalerConfig.behavior (``spec.behavior_json``), and
        without one none (KEDA passes none: the HPA's own limits); one None: the API
        server's default for that direction."""
        if scale_up is None and scale_down is None:
            scale_up, scale_down = parse_behavior(spec.behavior_json)
        self.keda = Keda(spec)
        self.hpa = Hpa(spec.hpa_min, spec.max_replicas, scale_up, scale_down)
        self._last_poll: float | None = None
        self._last_sync = -HPA_SYNC_S
        self._read: Observation | None = None  # the HPA's last observation through KEDA
        self.reason = ""  # why the last change happened

    def warm(self, now: float, replicas: int) -> None:
        """The loop has been running at ``replicas`` before ``now`` (a simulation window
        that opens on a running system): the HPA's scale-down window remembers that count,
        and KEDA's cooldown counts from ``now`` (with replicas running, as if a trigger had
        just been active) instead of treating the ScaledObject as never active, which
        would scale a minReplicaCount 0 workload to zero at its first inactive poll."""
        self.hpa.remember(now, replicas)
        if replicas > 0:
            self.keda.last_active = now

    def due(self, now: float, replicas: int) -> bool:
        return self.keda.due(now, self._last_poll) or (
            replicas > 0 and now - self._last_sync >= HPA_SYNC_S)

    def decide(self, now: float, replicas: int, ready: int, metrics: Sequence[Metric],
               active: bool | None) -> int:
        """The replica count after this moment's poll and sync. ``metrics``: the scaler's
        answers (a value None: GetMetrics failed); ``active``: IsActive's (None: failed)."""
        desired = replicas
        if self.keda.due(now, self._last_poll):
            self._last_poll = now
            reuse = (self._read if self.keda.spec.uses_hpa_observations and replicas > 0
                     and self.hpa.scaling_active else None)
            set_to = self.keda.poll(now, replicas, active, metrics, ready, seen=reuse)
            if set_to is not None and set_to != replicas:
                desired = set_to
                self.reason = f"KEDA: {self.keda.reason}"
        if desired == replicas and replicas > 0 and now - self._last_sync >= HPA_SYNC_S:
            self._last_sync = now
            seen = metrics
            if self.hpa.bounded(replicas) is None:  # the HPA reads no metric otherwise
                self._read = self.keda.observe(replicas, ready, metrics, active)
                seen = self._read.metrics
            desired = self.hpa.step(now, replicas, seen, ready)
            if desired != replicas:
                self.reason = f"HPA: {self.hpa.last_reason}"
        return desired
