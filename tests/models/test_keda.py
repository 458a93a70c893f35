"""KEDA model: activation, cooldown, initial cooldown, fallback and push timelines, each
against the KEDA v2.21.0 function named in its docstring."""

from __future__ import annotations

import pytest

from gpuscale.models.hpa import Hpa, Metric, MetricSource, TargetType
from gpuscale.models.keda import (
    Keda,
    ScaledObjectLoop,
    ScaledObjectSpec,
    fallback_count,
    fallback_value,
)


def ext(value: float | None, target: float = 10.0,
        kind: TargetType = TargetType.AVERAGE_VALUE) -> Metric:
    return Metric(MetricSource.EXTERNAL, kind, target, value)


def run(loop: ScaledObjectLoop, replicas: int, until: float,
        reading: tuple[list[Metric], bool | None], start: float = 0.0) -> list[tuple[float, int]]:
    """Every due moment from ``start`` to ``until`` (1 s steps) with the same reading; the
    (time, replicas) after each change."""
    changes, t = [], start
    while t <= until:
        if loop.due(t, replicas):
            got = loop.decide(t, replicas, replicas, *reading)
            if got != replicas:
                changes.append((t, got))
                replicas = got
        t += 1.0
    return changes


def test_activation_from_zero_and_cooldown_to_zero() -> None:
    """RequestScale: active at 0 -> scaleFromZeroOrIdle (max(min, 1)), active above 0 ->
    lastActiveTime; inactive -> scaleToZeroOrIdle once lastActiveTime + cooldownPeriod has
    passed."""
    k = Keda(ScaledObjectSpec(min_replicas=0, cooldown_s=300.0), created_at=-1000.0)
    assert k.poll(0.0, 0, False) is None  # idle at zero
    assert k.poll(30.0, 0, True) == 1  # activated: to max(min, 1)
    assert k.poll(60.0, 3, True) is None  # running: the HPA decides
    assert k.poll(90.0, 3, False) is None  # inactive since 60 s...
    assert k.poll(330.0, 3, False) is None  # 270 s: not yet
    assert k.poll(360.0, 3, False) == 0  # 300 s without activity: to zero
    assert k.reason == "inactive for 300s: to zero"


def test_min_replicas_above_zero_never_goes_to_zero_and_is_restored() -> None:
    """RequestScale: inactive with replicas below minReplicaCount -> minReplicaCount."""
    k = Keda(ScaledObjectSpec(min_replicas=2))
    assert k.poll(0.0, 0, True) == 2
    assert k.poll(10_000.0, 2, False) is None
    assert k.poll(10_030.0, 1, False) == 2


def test_never_active_counts_from_creation_with_the_initial_cooldown_only() -> None:
    """scaleToZeroOrIdle with LastActiveTime nil: CreationTimestamp + initialCooldownPeriod
    (default 0) before now - cooldownPeriod does not apply. So a ScaledObject created over
    a running, idle workload scales it to zero at its first poll, not cooldownPeriod after
    creation nor after its first poll; once active, initialCooldownPeriod no longer
    matters."""
    k = Keda(ScaledObjectSpec(cooldown_s=300.0), created_at=0.0)
    assert k.poll(0.0, 2, False) == 0
    assert k.reason == "since creation (never active) for 0s: to zero"
    held = Keda(ScaledObjectSpec(cooldown_s=60.0, initial_cooldown_s=600.0), created_at=0.0)
    assert held.poll(120.0, 1, False) is None  # cooldown passed, initial cooldown not
    assert held.poll(570.0, 1, False) is None
    assert held.poll(600.0, 1, False) == 0
    once = Keda(ScaledObjectSpec(cooldown_s=60.0, initial_cooldown_s=600.0), created_at=0.0)
    assert once.poll(0.0, 1, True) is None
    assert once.poll(60.0, 1, False) == 0  # lastActiveTime + 60 s: the initial 600 s no more


def test_active_while_another_metric_fails_keeps_lastactivetime() -> None:
    """RequestScale, active with isError ("PartialTriggerError"): lastActiveTime is not
    renewed, so the cooldown still counts from the last clean activity."""
    k = Keda(ScaledObjectSpec(cooldown_s=60.0), created_at=0.0)
    assert k.poll(0.0, 2, True, [ext(30.0), ext(30.0)]) is None
    assert k.last_active == 0.0
    assert k.poll(30.0, 2, True, [ext(30.0), ext(None)]) is None
    assert k.last_active == 0.0
    assert k.poll(60.0, 2, False, [ext(0.0), ext(0.0)]) == 0  # 60 s after 0, not after 30


def test_errors_hold_the_count_unless_the_fallback_is_zero_replicas() -> None:
    """RequestScale, inactive with isError: nothing without a fallback or with
    fallback.replicas != 0; with fallback.replicas 0 scaleToZeroOrIdle applies."""
    for fallback, want in ((None, None), (4, None), (0, 0)):
        k = Keda(ScaledObjectSpec(cooldown_s=60.0, fallback_replicas=fallback))
        assert k.poll(0.0, 2, True) is None
        assert k.poll(60.0, 2, None) == want, fallback


@pytest.mark.parametrize("threshold", [0, 1, 3])
def test_fallback_once_failures_exceed_the_threshold(threshold: int) -> None:
    """GetMetricsWithFallback: IncrementFailure, then fallback when the count is ABOVE
    failureThreshold (``*healthStatus.NumberOfFailures > FailureThreshold``); a success
    resets it. KEDA's poll itself sets no count for a fallback above zero replicas: the
    trigger counts as active (getScalerState: isActiveOrFallback), without error."""
    k = Keda(ScaledObjectSpec(fallback_replicas=4, failure_threshold=threshold))
    for i in range(threshold):
        assert k.poll(30.0 * i, 2, None) is None
        assert not k.fallback_active, f"failure {i + 1} of {threshold}"
    assert k.poll(30.0 * threshold, 2, None) is None
    assert k.fallback_active
    assert k.last_active == 30.0 * threshold  # active, not failing
    assert k.poll(300.0, 4, True) is None  # the scaler answers again
    assert (k.failures, k.fallback_active) == (0, False)
    no_fallback = Keda(ScaledObjectSpec())
    for i in range(10):
        assert no_fallback.poll(30.0 * i, 2, None) is None
    assert (no_fallback.failures, no_fallback.fallback_active) == (0, False)


def test_the_fallback_counts_polls_and_hpa_reads_alike() -> None:
    """GetMetricsWithFallback runs on KEDA's poll (getScalerState -> observeMetric) and on
    every HPA read (GetScaledObjectMetrics -> observeMetric): with failureThreshold 3, a
    30 s poll and the HPA's 15 s sync, failures 1-2 at 0 s (poll, read), 3 at 15 s, 4 at
    30 s (poll) - the HPA reads the fallback at 30 s, not at 90 s as four polls alone
    would take. fallback.replicas 4 x target 10 = 40 over 2 replicas: ceil(40 / 10) = 4."""
    loop = ScaledObjectLoop(ScaledObjectSpec(min_replicas=1, max_replicas=10,
                                             fallback_replicas=4, failure_threshold=3))
    assert run(loop, 2, 120.0, ([ext(None)], None)) == [(30.0, 4)]
    # 9 reads (0-120 s) and the polls at 0 and 30 s; from 60 s the HPA scales on the
    # fallback (ScalingActive) and the polls reuse its observation (UsesHPAObservations).
    assert loop.keda.failures == 11


def test_a_poll_uses_the_hpas_observation_while_it_scales() -> None:
    """UsesHPAObservations (minReplicaCount > 0) and hpaActivelyQuerying (the HPA's
    ScalingActive True): the poll takes the HPA's last record and counts nothing. Healthy
    until 30 s, then failing, failureThreshold 1: with minReplicaCount 1 the poll at 30 s
    reuses the 15 s read, the reads at 30 and 45 s count 1 and 2 - the fallback from 45 s;
    with minReplicaCount 0 the poll counts too - from 30 s. fallback 6 x 10 from 2
    replicas: the HPA's limit max(2 x 2, 4) = 4."""
    for min_replicas, at in ((1, 45.0), (0, 30.0)):
        loop = ScaledObjectLoop(ScaledObjectSpec(min_replicas=min_replicas, max_replicas=10,
                                                 fallback_replicas=6, failure_threshold=1))
        assert run(loop, 2, 29.0, ([ext(20.0)], True)) == []
        assert run(loop, 2, 60.0, ([ext(None)], None), start=30.0)[0] == (at, 4)


@pytest.mark.parametrize(("behavior", "current", "want"), [
    ("static", 8, 4), ("currentReplicas", 8, 8), ("currentReplicasIfHigher", 8, 8),
    ("currentReplicasIfLower", 8, 4), ("static", 2, 4), ("currentReplicas", 2, 2),
    ("currentReplicasIfHigher", 2, 4), ("currentReplicasIfLower", 2, 2), ("", 8, 4),
])
def test_fallback_behaviors(behavior: str, current: int, want: int) -> None:
    """doFallback's switch over fallback.behavior (replicas 4); an unknown one is static."""
    assert fallback_count(behavior, 4, current) == want


def test_the_fallback_is_a_value_the_hpa_takes_not_a_replica_count() -> None:
    """doFallback feeds the HPA count x target; the HPA's scale-down window (300 s, no
    behavior: stabilizeRecommendation) still holds what it recommended before. At 10
    replicas, failing from 0 s: static 4 is proposed from 30 s, reached at 315 s when the
    recommendation of 10 made at 0 s (warm) leaves the window; currentReplicasIfHigher
    answers 10 x target - ratio 1, keep 10 - where a model setting replicas would drop to
    4."""
    for behavior, want in (("static", [(315.0, 4)]), ("currentReplicasIfHigher", [])):
        loop = ScaledObjectLoop(ScaledObjectSpec(min_replicas=1, max_replicas=20,
                                                 fallback_replicas=4, failure_threshold=3,
                                                 fallback_behavior=behavior))
        loop.warm(0.0, 10)
        assert run(loop, 10, 900.0, ([ext(None)], None)) == want, behavior


def test_fallback_values_in_thousandths() -> None:
    """doFallback: NewMilliQuantity(int64(target x 1000 x replicas)); for Value, replicas
    divided by the target's Ready pods first, and an error with none Ready. The HPA reads
    thousandths (MilliValue), so 3 x 0.7 is 3 replicas, and 5 / 3 ready x 1.0 is 5."""
    hpa = Hpa(1, 100, None, None)
    three = fallback_value(3, ext(None, 0.7), 2)
    assert three is not None
    assert three == 2.1
    assert hpa.proposal(ext(three, 0.7), 2, 2) == 3
    value = fallback_value(5, ext(None, 1.0, TargetType.VALUE), 3)
    assert value is not None
    assert value == 1.666
    assert hpa.proposal(ext(value, 1.0, TargetType.VALUE), 4, 3) == 5
    assert fallback_value(5, ext(None, 1.0, TargetType.VALUE), 0) is None


def test_a_fallback_at_zero_activates() -> None:
    """At zero replicas a fallback is active (getScalerState: isActiveOrFallback), so
    RequestScale scales from zero to max(min, 1); a Value metric's fallback at zero has no
    Ready pod to divide by (doFallback returns nil: an error) and does not."""
    spec = ScaledObjectSpec(fallback_replicas=3, failure_threshold=0)
    assert Keda(spec).poll(0.0, 0, None, [ext(None)]) == 1
    assert Keda(spec).poll(0.0, 0, None, [ext(None, kind=TargetType.VALUE)], ready=0) is None


def test_push_true_activates_at_once_false_is_ignored() -> None:
    """startPushScalers: ``true`` -> RequestScale(active) between polls; ``false`` is
    ignored (inactivation comes from the polls)."""
    k = Keda(ScaledObjectSpec(min_replicas=0, polling_s=30.0))
    assert k.push(5.0, 0, False) is None
    assert k.push(7.0, 0, True) == 1  # between polls
    assert k.due(7.0, 0.0) is False
    assert k.due(30.0, 0.0) is True


def test_a_scaled_object_without_behavior_gets_the_hpas_own_limits() -> None:
    """controllers/keda/hpa.go newHPAForScaledObject passes the ScaledObject's behavior,
    nil without one, and the HPA then normalizes with normalizeDesiredReplicas: from 1
    replica at most max(2 x 1, 4) = 4; with a behavior (even ``{}``, the API server's
    defaults) max(1 + 4, 2 x 1) = 5."""
    wants_ten = ([ext(100.0)], True)
    plain = ScaledObjectLoop(ScaledObjectSpec(min_replicas=1))
    assert run(plain, 1, 0.0, wants_ten) == [(0.0, 4)]
    with_behavior = ScaledObjectLoop(ScaledObjectSpec(min_replicas=1, behavior_json="{}"))
    assert run(with_behavior, 1, 0.0, wants_ten) == [(0.0, 5)]


def test_a_fresh_loop_holds_its_count_and_a_warm_one_counts_its_cooldown() -> None:
    """recordInitialRecommendation: a fresh HPA's first sync records the current count, so
    a low reading does not scale 5 down before 300 s (the edge included: no behavior); and
    ``warm`` stands for a ScaledObject that has been active, whose cooldown to zero counts
    from the window's start (a never-active one goes at its first idle poll)."""
    low = ([ext(10.0)], True)  # proposes 1
    fresh = ScaledObjectLoop(ScaledObjectSpec(min_replicas=1, max_replicas=10))
    assert run(fresh, 5, 400.0, low) == [(315.0, 1)]
    assert fresh.reason.startswith("HPA: metrics propose 1")
    idle = ([ext(0.0)], False)
    cold = ScaledObjectLoop(ScaledObjectSpec(cooldown_s=300.0))
    assert run(cold, 3, 400.0, idle) == [(0.0, 0)]
    warm = ScaledObjectLoop(ScaledObjectSpec(cooldown_s=300.0))
    warm.warm(0.0, 3)
    assert run(warm, 3, 400.0, idle)[-1] == (300.0, 0)


def test_pods_metrics_bypass_kedas_scalers_and_keep_it_active() -> None:
    """getScalerState skips metric specs without ``External`` (cpu and memory triggers:
    the HPA reads those itself), and getScaledObjectState forces a ScaledObject whose
    triggers are all cpu or memory active, so it never scales to zero."""
    cpu = Metric(MetricSource.PODS, TargetType.AVERAGE_VALUE, 70.0, pod_values=(14.0, 14.0))
    k = Keda(ScaledObjectSpec(cooldown_s=60.0), created_at=0.0)
    assert k.poll(600.0, 2, None, [cpu]) is None
    assert k.last_active == 600.0
    loop = ScaledObjectLoop(ScaledObjectSpec(min_replicas=1, max_replicas=10))
    loop.hpa.fresh = False  # an HPA running long before: no recommendation to hold
    assert run(loop, 2, 0.0, ([cpu], None)) == [(0.0, 1)]  # ceil(0.2 x 2): the HPA's
