"""A model of the Kubernetes HPA v2 controller's replica decision, step by step.

Follows k8s.io/kubernetes v1.37.2 pkg/controller/podautoscaler (horizontal.go,
replica_calculator.go); the Go function each rule comes from is named where it is applied.

0. A fresh HPA records the current count as its first recommendation
   (recordInitialRecommendation). A count above max goes to max, one below min (above 0)
   to min, without reading a metric (reconcileAutoscaler).
1. Per metric, a proposal:
   - External, AverageValue T: ratio = value / (T x current); within tolerance -> current,
     else ceil(value / T) (GetExternalPerPodMetricReplicas).
   - External, Value T: ratio = value / T; within tolerance -> current, else
     ceil(ratio x ready pods) (GetExternalMetricReplicas).
   - Object: the same two formulas as External (GetObjectPerPodMetricReplicas for
     AverageValue, GetObjectMetricReplicas for Value).
   External and Object values and targets are read in thousandths (Quantity.MilliValue).
   - Pods (average per pod) T: ratio = mean / T over pods with a value; missing pods count
     as 0 when scaling up and as at-target when scaling down; unready pods count as 0 when
     scaling up; within tolerance -> current, else ceil(ratio x pods counted).
   A metric that cannot be read makes no proposal. Several metrics: the largest proposal.
   None readable, or some unreadable and the largest below current: no change, and nothing
   recorded (computeReplicasForMetrics returns -1); the ScalingActive condition is then
   False, else True.
2. Normalization, one of two (reconcileAutoscaler: ``hpa.Spec.Behavior == nil``):
   - no ``spec.behavior`` (normalizeDesiredReplicas; KEDA creates its HPA without one unless
     the ScaledObject sets advanced.horizontalPodAutoscalerConfig.behavior): the largest
     recommendation of the last 300 s, the window's edge included (stabilizeRecommendation,
     --horizontal-pod-autoscaler-downscale-stabilization), then at most
     max(2 x current, 4) per sync (convertDesiredReplicasWithRules: scaleUpLimitFactor,
     scaleUpLimitMinimum); no scale-down limit; clamped to [min, max].
   - ``spec.behavior`` set (normalizeDesiredReplicasWithBehaviors; the API server fills
     what it leaves out: SCALE_UP, SCALE_DOWN): the recommendation held between the smallest
     of the scale-up window and the largest of the scale-down window, edges excluded
     (stabilizeRecommendationWithBehaviors); then each policy's limit from the count at its
     period's start, current - added + removed within the period
     (calculateScaleUpLimitWithScalingRules, calculateScaleDownLimitWithBehaviors),
     ``selectPolicy`` Max / Min / Disabled, never past current the wrong way, clamped to
     [min, max] (convertDesiredReplicasWithBehaviorRate). A scale event replaces the last
     one older than its direction's longest period (storeScaleEvent).

Tolerance: 0.1 both ways (the controller's --horizontal-pod-autoscaler-tolerance), or per
direction as ``behavior.scaleUp.tolerance`` / ``scaleDown.tolerance`` (Kubernetes 1.33+,
feature HPAConfigurableTolerance; only with a behavior): a ratio r is "within" when
1 - down <= r <= 1 + up (Tolerances.isWithin).
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuscale.common.errors import ConfigError

TOLERANCE = 0.1
DOWNSCALE_STABILIZATION_S = 300.0  # --horizontal-pod-autoscaler-downscale-stabilization
SCALE_UP_LIMIT_FACTOR = 2  # horizontal.go scaleUpLimitFactor (no behavior)
SCALE_UP_LIMIT_MINIMUM = 4  # horizontal.go scaleUpLimitMinimum (no behavior)


class MetricSource(enum.StrEnum):
    """Where the HPA reads a metric (autoscaling/v2 MetricSourceType)."""

    EXTERNAL = "External"  # KEDA's metrics: one value for the workload
    OBJECT = "Object"  # one value for one object (custom.metrics.k8s.io); as External
    PODS = "Pods"  # one value per pod


class TargetType(enum.StrEnum):
    """autoscaling/v2 MetricTargetType, as KEDA's metricType sets it."""

    AVERAGE_VALUE = "AverageValue"
    VALUE = "Value"


class PolicyType(enum.StrEnum):
    """A scaling policy's unit (HPAScalingPolicyType)."""

    PODS = "Pods"
    PERCENT = "Percent"


class Select(enum.StrEnum):
    """Which policy wins (ScalingPolicySelect)."""

    MAX = "Max"
    MIN = "Min"
    DISABLED = "Disabled"


@dataclass(frozen=True, slots=True)
class Policy:
    kind: PolicyType
    value: int
    period_s: float


@dataclass(frozen=True, slots=True)
class Rules:
    stabilization_s: float
    policies: tuple[Policy, ...]
    select: Select = Select.MAX
    tolerance: float | None = None  # this direction's tolerance; None: the HPA's


# pkg/apis/autoscaling/v2/defaults.go: what the API server fills into a behavior.
SCALE_UP = Rules(0.0, (Policy(PolicyType.PERCENT, 100, 15.0), Policy(PolicyType.PODS, 4, 15.0)))
SCALE_DOWN = Rules(DOWNSCALE_STABILIZATION_S, (Policy(PolicyType.PERCENT, 100, 15.0),))


@dataclass(frozen=True, slots=True)
class Metric:
    """One metric reading for one sync. ``value`` None: the metric could not be read."""

    kind: MetricSource
    target_type: TargetType  # AVERAGE_VALUE or VALUE (External); AVERAGE_VALUE (Pods)
    target: float
    value: float | None = None  # External: the metric; Pods: unused
    pod_values: tuple[float | None, ...] = ()  # Pods: per ready pod (None: missing)
    unready_pods: int = 0  # Pods: pods not ready (no value used)


def _milli(x: float) -> int:
    """A quantity as the controller reads it (Quantity.MilliValue: whole thousandths,
    rounded up); float noise below a millionth of a thousandth is not a thousandth."""
    return math.ceil(round(x * 1000.0, 6))


@dataclass
class Hpa:
    """One HPA. ``scale_up``/``scale_down``: its ``spec.behavior`` - both None: none (the
    controller's own limits, normalizeDesiredReplicas); one None: the API server's default
    for that direction. ``fresh``: a controller that has not seen this HPA before (its
    first sync records the current count); False for one running long before ``remember``'s
    moments."""

    min_replicas: int
    max_replicas: int
    scale_up: Rules | None = SCALE_UP
    scale_down: Rules | None = SCALE_DOWN
    tolerance: float = TOLERANCE
    fresh: bool = True
    last_reason: str = ""
    scaling_active: bool = False  # the ScalingActive condition after the last metric read
    _recommendations: list[tuple[float, int]] = field(default_factory=list)
    _up_events: list[tuple[float, int]] = field(default_factory=list)  # (time, added)
    _down_events: list[tuple[float, int]] = field(default_factory=list)  # (time, removed)
    _synced: bool = False

    @property
    def has_behavior(self) -> bool:
        return self.scale_up is not None or self.scale_down is not None

    @property
    def up(self) -> Rules:
        return SCALE_UP if self.scale_up is None else self.scale_up

    @property
    def down(self) -> Rules:
        return SCALE_DOWN if self.scale_down is None else self.scale_down

    @property
    def down_window_s(self) -> float:
        """How long a recommendation holds a scale-down."""
        return self.down.stabilization_s if self.has_behavior else DOWNSCALE_STABILIZATION_S

    def within(self, ratio: float) -> bool:
        up = self.tolerance if self.up.tolerance is None else self.up.tolerance
        down = self.tolerance if self.down.tolerance is None else self.down.tolerance
        return 1.0 - down <= ratio <= 1.0 + up

    def bounded(self, current: int) -> int | None:
        """The count set without reading a metric: max for a count above it, min for one
        below it (reconcileAutoscaler); None: the metrics decide."""
        if current > self.max_replicas:
            return self.max_replicas
        if 0 < current < self.min_replicas:
            return self.min_replicas
        return None

    def proposal(self, metric: Metric, current: int, ready: int) -> int | None:
        """Step 1 for one metric (None: no proposal)."""
        if metric.kind in (MetricSource.EXTERNAL, MetricSource.OBJECT):
            if metric.value is None:
                return None
            value, target = _milli(metric.value), _milli(metric.target)
            if metric.target_type is TargetType.AVERAGE_VALUE:
                if current == 0:  # (HPAScaleToZero) value / (target x 0): infinite, or
                    # NaN for a value of 0 - which is never outside the tolerance
                    return math.ceil(value / target) if value > 0 else 0
                if self.within(value / (target * current)):
                    return current
                return math.ceil(value / target)
            ratio = value / target
            if current == 0:  # replica_calculator's getUsageRatioReplicaCount at zero
                return math.ceil(ratio)
            if self.within(ratio):
                return current
            return math.ceil(ratio * ready)
        present = [v for v in metric.pod_values if v is not None]
        if not present:
            return None
        missing = len(metric.pod_values) - len(present)
        ratio = sum(present) / len(present) / metric.target
        up_with_unready = metric.unready_pods > 0 and ratio > 1.0
        if not up_with_unready and not missing:
            if self.within(ratio):
                return current
            return math.ceil(ratio * len(present))
        # Missing pods: at target when scaling down, idle when scaling up; unready pods
        # idle when scaling up. Then the same test again, refusing to flip direction.
        filled = list(present)
        filled += [metric.target if ratio < 1.0 else 0.0] * missing
        if up_with_unready:
            filled += [0.0] * metric.unready_pods
        new_ratio = sum(filled) / len(filled) / metric.target
        if self.within(new_ratio) or (ratio < 1.0 < new_ratio) or \
                (ratio > 1.0 > new_ratio):
            return current
        replicas = math.ceil(new_ratio * len(filled))
        if (new_ratio < 1.0 and replicas > current) or (new_ratio > 1.0 and replicas < current):
            return current
        return replicas

    def step(self, now: float, current: int, metrics: Sequence[Metric],
             ready: int | None = None) -> int:
        """One sync at time ``now`` (seconds) with ``current`` replicas; returns the
        desired count and records it. ``ready`` defaults to ``current``."""
        ready = current if ready is None else ready
        if not self._synced and self.fresh and not self._recommendations:
            self._recommendations.append((now, current))  # recordInitialRecommendation
        self._synced = True
        bound = self.bounded(current)
        if bound is not None:
            self.last_reason = f"{current} outside [{self.min_replicas}, " \
                               f"{self.max_replicas}]: to {bound}"
            self._store_event(now, current, bound)
            return bound
        proposals = [self.proposal(m, current, ready) for m in metrics]
        valid = [p for p in proposals if p is not None]
        if not valid:
            self.scaling_active = False
            self.last_reason = "no metric could be read: keeping the current count"
            return current
        desired = max(valid)
        if len(valid) < len(proposals) and desired < current:
            self.scaling_active = False
            self.last_reason = "some metrics missing: not scaling down"
            return current
        self.scaling_active = True
        self.last_reason = f"metrics propose {desired}"
        if self.has_behavior:
            desired = self._stabilize(now, current, desired)
            desired = self._rate_limit(now, current, desired)
        else:
            desired = self._normalize(now, current, desired)
        self._store_event(now, current, desired)
        return desired

    def remember(self, now: float, recommendation: int) -> None:
        """Record a past recommendation (a controller that was already running)."""
        self._recommendations.append((now, recommendation))

    def _normalize(self, now: float, current: int, recommendation: int) -> int:
        """No behavior: normalizeDesiredReplicas."""
        self._recommendations = [(t, r) for t, r in self._recommendations
                                 if now - t <= DOWNSCALE_STABILIZATION_S]
        held = max([r for _, r in self._recommendations] + [recommendation])
        self._recommendations.append((now, recommendation))
        if held != recommendation:
            self.last_reason += f"; stabilized to {held}"
        if held < self.min_replicas:
            return self.min_replicas
        limit = max(SCALE_UP_LIMIT_FACTOR * current, SCALE_UP_LIMIT_MINIMUM)
        top = min(self.max_replicas, limit)
        if held > top:
            if top == limit:
                self.last_reason += f"; scale-up limited to {limit} (max(2 x {current}, 4))"
            return top
        return held

    def _stabilize(self, now: float, current: int, recommendation: int) -> int:
        self._recommendations.append((now, recommendation))
        horizon = max(self.up.stabilization_s, self.down.stabilization_s)
        self._recommendations = [(t, r) for t, r in self._recommendations
                                 if now - t <= horizon]
        # Recommendations strictly inside each window count (the controller keeps those
        # whose timestamp is After(now - window)); this one, made now, always does.
        up = min([r for t, r in self._recommendations
                  if now - t < self.up.stabilization_s] + [recommendation])
        down = max([r for t, r in self._recommendations
                    if now - t < self.down.stabilization_s] + [recommendation])
        result = min(max(current, up), down)
        if result != recommendation:
            self.last_reason += f"; stabilized to {result}"
        return result

    def _period_start(self, now: float, current: int, period: float) -> int:
        """The count when a policy's period began (getReplicasChangePerPeriod: events
        After(now - period))."""
        added = sum(n for t, n in self._up_events if now - t < period)
        removed = sum(n for t, n in self._down_events if now - t < period)
        return current - added + removed

    def _rate_limit(self, now: float, current: int, desired: int) -> int:
        if desired > current:
            rules = self.up
            if rules.select is Select.DISABLED:
                self.last_reason += "; scale-up disabled"
                return current
            ups = []
            for p in rules.policies:
                start = self._period_start(now, current, p.period_s)
                ups.append(start + p.value if p.kind is PolicyType.PODS
                           else math.ceil(start * (1 + p.value / 100)))
            limit = max(current, max(ups) if rules.select is Select.MAX else min(ups))
            top = min(self.max_replicas, limit)
            if desired > top and top == limit:
                self.last_reason += f"; scale-up limited to {limit}"
            return min(desired, top)
        if desired < current:
            rules = self.down
            if rules.select is Select.DISABLED:
                self.last_reason += "; scale-down disabled"
                return current
            downs = []
            for p in rules.policies:
                start = self._period_start(now, current, p.period_s)
                downs.append(start - p.value if p.kind is PolicyType.PODS
                             else int(start * (1 - p.value / 100)))
            limit = min(current, min(downs) if rules.select is Select.MAX else max(downs))
            bottom = max(self.min_replicas, limit)
            if desired < bottom and bottom == limit:
                self.last_reason += f"; scale-down limited to {limit}"
            return max(desired, bottom)
        return desired

    def _store_event(self, now: float, before: int, after: int) -> None:
        """storeScaleEvent: kept only with a behavior; the new event takes the place of the
        last one older than its direction's longest policy period."""
        if after == before or not self.has_behavior:
            return
        events, rules = ((self._up_events, self.up) if after > before
                         else (self._down_events, self.down))
        longest = max((p.period_s for p in rules.policies), default=0.0)
        outdated = [i for i, (t, _) in enumerate(events) if now - t > longest]
        event = (now, abs(after - before))
        if outdated:
            events[outdated[-1]] = event
        else:
            events.append(event)


def parse_behavior(text: str) -> tuple[Rules | None, Rules | None]:
    """An HPA ``behavior`` (JSON) as ``Hpa``'s rules: "" - none - is (None, None); what a
    behavior leaves out is the API server's default (SetDefaults_HorizontalPodAutoscaler
    Behavior). ConfigError for one that is not a behavior."""
    if not text:
        return None, None
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ConfigError(f"behavior: not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ConfigError("behavior: not an object")
    return (_rules(doc.get("scaleUp"), SCALE_UP, "scaleUp"),
            _rules(doc.get("scaleDown"), SCALE_DOWN, "scaleDown"))


def _rules(raw: Any, default: Rules, where: str) -> Rules:
    if raw is None:
        return default
    if not isinstance(raw, dict):
        raise ConfigError(f"behavior.{where}: not an object")
    window = raw.get("stabilizationWindowSeconds", default.stabilization_s)
    if not isinstance(window, int | float) or isinstance(window, bool) or \
            not 0 <= window <= 3600:
        raise ConfigError(f"behavior.{where}.stabilizationWindowSeconds: {window!r} is "
                          f"not 0..3600")
    policies = default.policies
    if "policies" in raw:
        if not isinstance(raw["policies"], list):
            raise ConfigError(f"behavior.{where}.policies: not a list")
        policies = tuple(_policy(p, where) for p in raw["policies"])
    select = raw.get("selectPolicy", default.select.value)
    if not isinstance(select, str) or select not in {s.value for s in Select}:
        raise ConfigError(f"behavior.{where}.selectPolicy: {select!r} is not Max, Min or "
                          f"Disabled")
    tolerance = raw.get("tolerance", default.tolerance)
    if tolerance is not None:
        try:
            tolerance = float(tolerance)
        except (TypeError, ValueError):
            raise ConfigError(f"behavior.{where}.tolerance: {tolerance!r} is not a "
                              f"number") from None
    return Rules(float(window), policies, Select(select), tolerance)


def _policy(raw: Any, where: str) -> Policy:
    if not isinstance(raw, dict):
        raise ConfigError(f"behavior.{where}.policies: an entry is not an object")
    kind, value, period = raw.get("type"), raw.get("value"), raw.get("periodSeconds")
    if not isinstance(kind, str) or kind not in ("Pods", "Percent") or \
            not isinstance(value, int) or not isinstance(period, int) or value <= 0 or \
            not 0 < period <= 1800:
        raise ConfigError(f"behavior.{where}.policies: {json.dumps(raw)[:120]} needs type "
                          f"Pods|Percent, value > 0, periodSeconds 1..1800")
    return Policy(PolicyType(kind), value, float(period))
