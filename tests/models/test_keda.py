"""KEDA model: activation, cooldown, initial cooldown, fallback and push timelines."""

from __future__ import annotations

import pytest

from gpuscale.models.hpa import Metric, MetricSource, TargetType
from gpuscale.models.keda import Keda, ScaledObjectLoop, ScaledObjectSpec


def test_activation_from_zero_and_cooldown_to_zero() -> None:
    k = Keda(ScaledObjectSpec(min_replicas=0, cooldown_s=300.0))
    assert k.poll(0.0, 0, False) is None  # idle at zero
    assert k.poll(30.0, 0, True) == 1  # activated: to max(min, 1)
    assert k.poll(60.0, 3, True) is None  # running: the HPA decides
    assert k.poll(90.0, 3, False) is None  # inactive since 60 s...
    assert k.poll(330.0, 3, False) is None  # 270 s: not yet
    assert k.poll(360.0, 3, False) == 0  # 300 s without activity: to zero
    assert k.reason == "inactive for 300s: to zero"


def test_min_replicas_above_zero_never_goes_to_zero() -> None:
    k = Keda(ScaledObjectSpec(min_replicas=2))
    assert k.poll(0.0, 0, True) == 2
    assert k.poll(10_000.0, 2, False) is None


def test_initial_cooldown_holds_new_workloads() -> None:
    k = Keda(ScaledObjectSpec(cooldown_s=60.0, initial_cooldown_s=600.0), created_at=0.0)
    assert k.poll(120.0, 1, False) is None  # cooldown passed, initial cooldown not
    assert k.poll(600.0, 1, False) == 0


@pytest.mark.parametrize("threshold", [0, 1, 3])
def test_fallback_once_failures_exceed_the_threshold(threshold: int) -> None:
    """KEDA counts the failure, then falls back when the count is ABOVE failureThreshold
    (pkg/fallback/fallback.go: ``*healthStatus.NumberOfFailures > FailureThreshold``): with
    3, the fourth failing poll in a row is the first at the fallback count."""
    k = Keda(ScaledObjectSpec(fallback_replicas=4, failure_threshold=threshold))
    for i in range(threshold):
        assert k.poll(30.0 * i, 2, None) is None, f"failure {i + 1} of {threshold}"
    assert k.poll(30.0 * threshold, 2, None) == 4
    assert k.poll(90.0, 4, True) is None  # the scaler answers again: back to the HPA
    assert k.failures == 0
    no_fallback = Keda(ScaledObjectSpec())
    assert all(no_fallback.poll(30.0 * i, 2, None) is None for i in range(10))


def test_push_true_activates_at_once_false_is_ignored() -> None:
    k = Keda(ScaledObjectSpec(min_replicas=0, polling_s=30.0))
    assert k.push(5.0, 0, False) is None
    assert k.push(7.0, 0, True) == 1  # between polls
    assert k.due(7.0, 0.0) is False
    assert k.due(30.0, 0.0) is True


def test_a_warm_loop_remembers_its_count_for_the_scale_down_window() -> None:
    """A window of traffic opening on a running system: the HPA has been at 5, so a low
    reading does not scale down before the 300 s window passes; a fresh loop would at once."""
    low = [Metric(MetricSource.EXTERNAL, TargetType.AVERAGE_VALUE, 10.0, 10.0)]  # proposes 1
    fresh = ScaledObjectLoop(ScaledObjectSpec(min_replicas=1, max_replicas=10))
    assert fresh.decide(0.0, 5, 5, low, True) == 1
    warm = ScaledObjectLoop(ScaledObjectSpec(min_replicas=1, max_replicas=10))
    warm.warm(0.0, 5)
    replicas, t = 5, 0.0
    while t < 300.0:
        if warm.due(t, replicas):
            replicas = warm.decide(t, replicas, replicas, low, True)
            assert replicas == 5, t
        t += 1.0
    while not warm.due(t, replicas):
        t += 1.0
    assert warm.decide(t, replicas, replicas, low, True) == 1
    assert warm.reason.startswith("HPA: metrics propose 1")
