"""A model of the Kubernetes HPA v2 controller's replica decision, step by step.

Follows the documented algorithm (k8s.io/kubernetes pkg/controller/podautoscaler):

1. Per metric, a proposal:
   - External, AverageValue T: ratio = value / (T x current); within tolerance -> current,
     else ceil(value / T).
   - External, Value T: ratio = value / T; within tolerance -> current, else
     ceil(ratio x ready pods).
   - Object: the same two formulas as External (GetObjectPerPodMetricReplicas for
     AverageValue, GetObjectMetricReplicas for Value).
   - Pods (average per pod) T: ratio = mean / T over pods with a value; missing pods count
     as 0 when scaling up and as at-target when scaling down; unready pods count as 0 when
     scaling up; within tolerance -> current, else ceil(ratio x pods counted).
   A metric that cannot be read makes no proposal. Several metrics: the largest proposal;
   if some failed and the largest is below current, keep current (never scale down on
   partial data).
2. Stabilization: the recommendation is held between the smallest recommendation in the
   scale-up window and the largest in the scale-down window (defaults 0 s and 300 s).
3. Rate limits: scale-up and scale-down policies over their periods (defaults: up 100 % or
   4 pods per 15 s, whichever allows more; down 100 % per 15 s), ``selectPolicy``
   Max / Min / Disabled, counted from the replica changes inside each period.
4. Clamped to [min, max].

Tolerance: 0.1 both ways (the controller's --horizontal-pod-autoscaler-tolerance), or per
HPA and per direction as ``behavior.scaleUp.tolerance`` / ``scaleDown.tolerance``
(Kubernetes 1.33+, feature HPAConfigurableTolerance): a ratio r is "within" when
1 - down <= r <= 1 + up.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

TOLERANCE = 0.1


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


SCALE_UP = Rules(0.0, (Policy(PolicyType.PERCENT, 100, 15.0), Policy(PolicyType.PODS, 4, 15.0)))
SCALE_DOWN = Rules(300.0, (Policy(PolicyType.PERCENT, 100, 15.0),))


@dataclass(frozen=True, slots=True)
class Metric:
    """One metric reading for one sync. ``value`` None: the metric could not be read."""

    kind: MetricSource
    target_type: TargetType  # AVERAGE_VALUE or VALUE (External); AVERAGE_VALUE (Pods)
    target: float
    value: float | None = None  # External: the metric; Pods: unused
    pod_values: tuple[float | None, ...] = ()  # Pods: per ready pod (None: missing)
    unready_pods: int = 0  # Pods: pods not ready (no value used)


@dataclass
class Hpa:
    min_replicas: int
    max_replicas: int
    scale_up: Rules = SCALE_UP
    scale_down: Rules = SCALE_DOWN
    tolerance: float = TOLERANCE
    _recommendations: list[tuple[float, int]] = field(default_factory=list)
    _events: list[tuple[float, int]] = field(default_factory=list)  # (time, +/- replicas)
    last_reason: str = ""

    def within(self, ratio: float) -> bool:
        up = self.tolerance if self.scale_up.tolerance is None else self.scale_up.tolerance
        down = (self.tolerance if self.scale_down.tolerance is None
                else self.scale_down.tolerance)
        return 1.0 - down <= ratio <= 1.0 + up

    def proposal(self, metric: Metric, current: int, ready: int) -> int | None:
        """Step 1 for one metric (None: no proposal)."""
        if metric.kind in (MetricSource.EXTERNAL, MetricSource.OBJECT):
            if metric.value is None:
                return None
            if metric.target_type is TargetType.AVERAGE_VALUE:
                if current == 0:  # (HPAScaleToZero) value / (target x 0): infinite, or
                    # NaN for a value of 0 - which is never outside the tolerance
                    return math.ceil(metric.value / metric.target) if metric.value > 0 else 0
                ratio = metric.value / (metric.target * current)
                if self.within(ratio):
                    return current
                return math.ceil(metric.value / metric.target)
            ratio = metric.value / metric.target
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
        proposals = [self.proposal(m, current, ready) for m in metrics]
        valid = [p for p in proposals if p is not None]
        if not valid:
            self.last_reason = "no metric could be read: keeping the current count"
            return current
        desired = max(valid)
        if len(valid) < len(proposals) and desired < current:
            desired = current
            self.last_reason = "some metrics missing: not scaling down"
        else:
            self.last_reason = f"metrics propose {desired}"
        desired = self._stabilize(now, current, desired)
        desired = self._rate_limit(now, current, desired)
        desired = min(self.max_replicas, max(self.min_replicas, desired))
        if desired != current:
            self._events.append((now, desired - current))
        return desired

    def remember(self, now: float, recommendation: int) -> None:
        """Record a past recommendation (a controller that was already running)."""
        self._recommendations.append((now, recommendation))

    def _stabilize(self, now: float, current: int, recommendation: int) -> int:
        self._recommendations.append((now, recommendation))
        horizon = max(self.scale_up.stabilization_s, self.scale_down.stabilization_s)
        self._recommendations = [(t, r) for t, r in self._recommendations
                                 if now - t <= horizon]
        # Recommendations strictly inside each window count (the controller keeps those
        # whose timestamp is After(now - window)); this one, made now, always does.
        up = min([r for t, r in self._recommendations
                  if now - t < self.scale_up.stabilization_s] + [recommendation])
        down = max([r for t, r in self._recommendations
                    if now - t < self.scale_down.stabilization_s] + [recommendation])
        result = current
        result = max(result, up)
        result = min(result, down)
        if result != recommendation:
            self.last_reason += f"; stabilized to {result}"
        return result

    def _changed_within(self, now: float, period: float, up: bool) -> int:
        return sum(d for t, d in self._events if now - t < period and (d > 0) == up)

    def _rate_limit(self, now: float, current: int, desired: int) -> int:
        if desired > current:
            rules = self.scale_up
            if rules.select is Select.DISABLED:
                self.last_reason += "; scale-up disabled"
                return current
            limits = []
            for p in rules.policies:
                start = current - self._changed_within(now, p.period_s, up=True)
                limits.append(start + p.value if p.kind is PolicyType.PODS
                              else math.ceil(start * (1 + p.value / 100)))
            limit = max(limits) if rules.select is Select.MAX else min(limits)
            if desired > limit:
                self.last_reason += f"; scale-up limited to {limit}"
            return min(desired, limit)
        if desired < current:
            rules = self.scale_down
            if rules.select is Select.DISABLED:
                self.last_reason += "; scale-down disabled"
                return current
            limits = []
            for p in rules.policies:
                start = current - self._changed_within(now, p.period_s, up=False)
                limits.append(start - p.value if p.kind is PolicyType.PODS
                              else int(start * (1 - p.value / 100)))
            limit = min(limits) if rules.select is Select.MAX else max(limits)
            if desired < limit:
                self.last_reason += f"; scale-down limited to {limit}"
            return max(desired, limit)
        return desired
