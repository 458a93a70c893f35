"""The HPA model against hand-computed cases from Kubernetes v1.37.2's controller
(pkg/controller/podautoscaler: the function each test follows is in its docstring), and
properties."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscale.common.errors import ConfigError
from gpuscale.models.hpa import (
    SCALE_DOWN,
    SCALE_UP,
    Hpa,
    Metric,
    MetricSource,
    Policy,
    PolicyType,
    Rules,
    Select,
    TargetType,
    parse_behavior,
)
from tests.support.strategies import json_values


def ext(value: float | None, target: float, kind: str = "AverageValue") -> Metric:
    return Metric(MetricSource.EXTERNAL, TargetType(kind), target, value)


def pods(values: list[float | None], target: float, unready: int = 0) -> Metric:
    return Metric(MetricSource.PODS, TargetType.AVERAGE_VALUE, target, pod_values=tuple(values),
                  unready_pods=unready)


@pytest.mark.parametrize(("value", "current", "want"), [
    (350.0, 5, 5),    # 350 / (70 * 5) = 1.0: at target
    (380.0, 5, 5),    # ratio 1.086: inside the 10 % tolerance band
    (390.0, 5, 6),    # ratio 1.114: outside -> ceil(390 / 70) = 6
    (320.0, 5, 5),    # ratio 0.914: inside the band
    (300.0, 5, 5),    # ratio 0.857: outside -> ceil(300 / 70) = ceil(4.29) = 5
    (200.0, 5, 3),    # ceil(2.86) = 3
    (0.0, 5, 0),
])
def test_external_average_value(value: float, current: int, want: int) -> None:
    assert Hpa(0, 100).proposal(ext(value, 70.0), current, current) == want


@pytest.mark.parametrize(("value", "ready", "want"), [
    (70.0, 4, 4), (76.0, 4, 4), (80.0, 4, 5), (35.0, 4, 2), (140.0, 3, 6)])
def test_external_value_uses_ready_pods(value: float, ready: int, want: int) -> None:
    assert Hpa(0, 100).proposal(ext(value, 70.0, "Value"), 4, ready) == want


def test_pods_metric_missing_and_unready() -> None:
    hpa = Hpa(1, 100)
    # Scale-up: 2 pods at 100 (target 50) and 1 missing + 1 unready count as 0:
    # (100+100+0+0)/4 = 50 -> ratio 1.0 -> keep current.
    assert hpa.proposal(pods([100.0, 100.0, None], 50.0, unready=1), 4, 3) == 4
    # Scale-down: 2 pods at 10 (target 50) and 2 missing counted at target: (10+10+50+50)/4
    # = 30 -> ratio 0.6 -> ceil(0.6 * 4) = 3.
    assert hpa.proposal(pods([10.0, 10.0, None, None], 50.0), 4, 4) == 3
    # No data at all: no proposal.
    assert hpa.proposal(pods([None, None], 50.0), 2, 2) is None


def test_scale_up_policies_default_max_of_100_percent_and_4_pods() -> None:
    hpa = Hpa(1, 100)
    # From 1: 100 % -> 2, 4 pods -> 5; Max -> 5 (value asks for 10).
    assert hpa.step(0.0, 1, [ext(700.0, 70.0)]) == 5
    # 10 s later, inside the 15 s period: the 4 added count; limit max(5*... start 1) -> 5.
    assert hpa.step(10.0, 5, [ext(700.0, 70.0)]) == 5
    assert hpa.step(16.0, 5, [ext(700.0, 70.0)]) == 10  # new period: 5 -> min(10, 10)


def test_select_policy_min_and_disabled() -> None:
    slow = Hpa(1, 100, scale_up=Rules(0.0, SCALE_UP.policies, Select.MIN))
    assert slow.step(0.0, 1, [ext(700.0, 70.0)]) == 2  # min(2, 5)
    frozen = Hpa(1, 100, scale_up=Rules(0.0, SCALE_UP.policies, Select.DISABLED))
    assert frozen.step(0.0, 3, [ext(700.0, 70.0)]) == 3


def test_scale_down_waits_for_the_stabilization_window() -> None:
    hpa = Hpa(1, 100)
    assert hpa.step(0.0, 10, [ext(700.0, 70.0)]) == 10
    # Load drops at once: the 300 s window still holds the recommendation of 10.
    for t in range(15, 300, 15):
        assert hpa.step(float(t), 10, [ext(140.0, 70.0)]) == 10
    assert hpa.step(301.0, 10, [ext(140.0, 70.0)]) == 2  # 100 %/15 s allows it all


def test_scale_down_rate_limit() -> None:
    hpa = Hpa(1, 100, scale_down=Rules(0.0, (Policy(PolicyType.PODS, 2, 60.0),)))
    assert hpa.step(0.0, 10, [ext(70.0, 70.0)]) == 8
    assert hpa.step(30.0, 8, [ext(70.0, 70.0)]) == 8  # 2 already removed in this minute
    assert hpa.step(61.0, 8, [ext(70.0, 70.0)]) == 6


def test_missing_metrics() -> None:
    hpa = Hpa(1, 100, scale_down=Rules(0.0, SCALE_DOWN.policies))
    assert hpa.step(0.0, 4, [ext(None, 70.0)]) == 4  # nothing readable: keep
    # One of two metrics missing and the other proposes less: do not scale down.
    assert hpa.step(15.0, 4, [ext(70.0, 70.0), ext(None, 5.0)]) == 4
    # ... but scaling up on partial data is allowed.
    assert hpa.step(30.0, 4, [ext(700.0, 70.0), ext(None, 5.0)]) == 8


def test_several_metrics_take_the_largest() -> None:
    hpa = Hpa(1, 100)
    assert hpa.step(0.0, 2, [ext(140.0, 70.0), ext(30.0, 5.0)]) == 6  # max(2, 6)


@pytest.mark.parametrize("behavior", [True, False])
@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 5000), st.integers(0, 40)), min_size=1, max_size=40),
       st.integers(1, 5), st.integers(5, 30))
def test_properties(behavior: bool, loads: list[tuple[float, int]], lo: int, hi: int) -> None:
    """Never outside [min, max]; a scale-down never goes below the largest recommendation
    of the last 300 s (the stabilization window), clamped to the bounds - with the default
    behavior and without one."""
    hpa = Hpa(lo, hi) if behavior else Hpa(lo, hi, None, None)
    current = lo
    recommendations: list[tuple[float, int]] = []
    for i, (load, _) in enumerate(loads):
        now = 15.0 * i
        metric = ext(load, 70.0)
        proposal = hpa.proposal(metric, current, current)
        assert proposal is not None
        recommendations.append((now, proposal))
        desired = hpa.step(now, current, [metric])
        assert lo <= desired <= hi
        if desired < current:
            held = max(r for t, r in recommendations if now - t <= 300.0)
            assert desired >= min(hi, max(lo, held))
        current = desired


@pytest.mark.parametrize(("value", "up", "down", "want"), [
    # 20 pods at target 100: ratio = value / 2,000.
    (2_080.0, 0.05, 0.1, 20),   # 1.04: inside a 5 % up band -> stays at 20
    (2_080.0, 0.03, 0.1, 21),   # 1.04 > 1.03: outside -> ceil(2080 / 100) = 21
    (2_100.0, None, 0.1, 20),   # 1.05: the HPA's default 10 % band
    (2_100.0, 0.01, 0.1, 21),   # a 1 % scale-up tolerance reacts to 5 % more load
    (1_850.0, 0.1, 0.1, 20),    # 0.925: inside the default down band
    (1_850.0, 0.1, 0.05, 19),   # outside a 5 % down band -> ceil(18.5) = 19
    (1_850.0, 0.1, None, 20),
])
def test_per_direction_tolerances(value: float, up: float | None, down: float | None,
                                  want: int) -> None:
    """behavior.scaleUp/scaleDown.tolerance (Kubernetes 1.33+): within when
    1 - down <= ratio <= 1 + up; unset directions use the HPA's 0.1."""
    hpa = Hpa(1, 100, scale_up=Rules(0.0, SCALE_UP.policies, tolerance=up),
              scale_down=Rules(300.0, SCALE_DOWN.policies, tolerance=down))
    assert hpa.proposal(ext(value, 100.0), 20, 20) == want


@pytest.mark.parametrize(("current", "plain", "defaults"), [
    (1, 4, 5), (2, 4, 6), (3, 6, 7), (4, 8, 8), (10, 20, 20)])
def test_without_behavior_scale_up_is_max_of_double_and_four(current: int, plain: int,
                                                              defaults: int) -> None:
    """normalizeDesiredReplicas -> convertDesiredReplicasWithRules: at most
    calculateScaleUpLimit = max(scaleUpLimitFactor 2 x current, scaleUpLimitMinimum 4) per
    sync; the API server's default behavior (100 % or 4 pods per 15 s, the larger) allows
    max(current + 4, 2 x current)."""
    wants_fifty = [ext(3_500.0, 70.0)]
    assert Hpa(1, 100, None, None).step(0.0, current, wants_fifty) == plain
    assert Hpa(1, 100).step(0.0, current, wants_fifty) == defaults


def test_without_behavior_the_limit_has_no_period() -> None:
    """No behavior: no scale events are kept (storeScaleEvent returns), so each sync may
    double again - 1, 4, 8, 16 a second apart; the default behavior counts the pods added
    within its 15 s period."""
    plain, behaved = Hpa(1, 100, None, None), Hpa(1, 100)
    wants_fifty = [ext(3_500.0, 70.0)]
    counts, n = [], 1
    for t in (0.0, 1.0, 2.0):
        n = plain.step(t, n, wants_fifty)
        counts.append(n)
    assert counts == [4, 8, 16]
    assert behaved.step(0.0, 1, wants_fifty) == 5
    assert behaved.step(1.0, 5, wants_fifty) == 5  # 4 added within 15 s: from 1, max 5


def test_stabilization_window_edges() -> None:
    """stabilizeRecommendation (no behavior) drops a recommendation only when it is Before
    now - 300 s, so one made exactly 300 s ago still holds; stabilizeRecommendationWith
    Behaviors keeps only those After now - window, so it no longer does. No behavior
    limits no scale-down (convertDesiredReplicasWithRules)."""
    plain, behaved = Hpa(1, 100, None, None), Hpa(1, 100)
    for hpa in (plain, behaved):
        assert hpa.step(0.0, 10, [ext(700.0, 70.0)]) == 10
    assert plain.step(300.0, 10, [ext(140.0, 70.0)]) == 10
    assert behaved.step(300.0, 10, [ext(140.0, 70.0)]) == 2
    assert plain.step(301.0, 10, [ext(140.0, 70.0)]) == 2


def test_a_fresh_hpa_records_the_current_count_first() -> None:
    """recordInitialRecommendation: the controller's first sync of an HPA records the
    current count, so a low first reading does not scale down within the window."""
    low = [ext(70.0, 70.0)]  # proposes 1
    assert Hpa(1, 100).step(0.0, 5, low) == 5
    assert Hpa(1, 100, None, None).step(0.0, 5, low) == 5
    assert Hpa(1, 100, fresh=False).step(0.0, 5, low) == 1
    zero_window = Hpa(1, 100, scale_down=Rules(0.0, SCALE_DOWN.policies))
    assert zero_window.step(0.0, 5, low) == 1  # a 0 s window holds nothing


def test_unreadable_metrics_record_no_recommendation() -> None:
    """computeReplicasForMetrics returns -1 when no metric is readable, or some are not and
    the rest propose less than current; reconcileAutoscaler then returns before
    normalizing, so that moment leaves no recommendation to hold a later scale-down."""
    hpa = Hpa(1, 100, fresh=False)
    assert hpa.step(0.0, 4, [ext(70.0, 70.0), ext(None, 5.0)]) == 4
    assert not hpa.scaling_active
    assert hpa.step(15.0, 4, [ext(70.0, 70.0)]) == 1
    assert hpa.scaling_active


def test_counts_outside_the_bounds_are_set_without_reading_metrics() -> None:
    """reconcileAutoscaler: currentReplicas > MaxReplicas -> MaxReplicas, < MinReplicas ->
    MinReplicas, before any metric is computed (an unreadable one included)."""
    hpa = Hpa(2, 5)
    assert hpa.step(0.0, 8, [ext(None, 70.0)]) == 5
    assert hpa.step(15.0, 1, [ext(None, 70.0)]) == 2


def test_policy_periods_start_from_both_directions() -> None:
    """calculateScaleUpLimitWithScalingRules: periodStartReplicas = current - added +
    removed within the period. 10 -> 8 (2 pods per 60 s down), then up: from 8 + 2 = 10,
    +2 pods -> 12."""
    two = (Policy(PolicyType.PODS, 2, 60.0),)
    hpa = Hpa(1, 100, Rules(0.0, two), Rules(0.0, two), fresh=False)
    assert hpa.step(0.0, 10, [ext(70.0, 70.0)]) == 8
    assert hpa.step(15.0, 8, [ext(7_000.0, 70.0)]) == 12


def test_a_scale_event_replaces_the_last_outdated_one() -> None:
    """storeScaleEvent: a new scale-up event takes the place of the last one older than
    the scale-up policies' longest period (markScaleEventsOutdated, 15 s here), even where
    a longer scale-down period still spans it. Up 2 -> 6 at 0 s, 6 -> 10 at 20 s (the 0 s
    event replaced); down at 30 s, 2 pods per 60 s, from 10 - 4 = 6: to 4, not to 1."""
    hpa = Hpa(1, 100, Rules(0.0, (Policy(PolicyType.PODS, 4, 15.0),)),
              Rules(0.0, (Policy(PolicyType.PODS, 2, 60.0),)), fresh=False)
    assert hpa.step(0.0, 2, [ext(7_000.0, 70.0)]) == 6
    assert hpa.step(20.0, 6, [ext(7_000.0, 70.0)]) == 10
    assert hpa.step(30.0, 10, [ext(70.0, 70.0)]) == 4


def test_values_are_read_in_thousandths() -> None:
    """GetExternalPerPodMetricReplicas divides MilliValue()s: 2.1 over a target of 0.7 is
    ceil(2100 / 700) = 3, where floats give ceil(3.0000000000000004) = 4."""
    assert Hpa(1, 100).proposal(ext(2.1, 0.7), 2, 2) == 3


def test_parse_behavior_fills_the_api_servers_defaults() -> None:
    """No behavior is (None, None); a behavior's missing direction and fields are
    SetDefaults_HorizontalPodAutoscalerBehavior's."""
    assert parse_behavior("") == (None, None)
    assert parse_behavior("{}") == (SCALE_UP, SCALE_DOWN)
    up, down = parse_behavior('{"scaleDown": {"stabilizationWindowSeconds": 0}}')
    assert (up, down) == (SCALE_UP, Rules(0.0, SCALE_DOWN.policies))
    assert Hpa(1, 10, up, down).has_behavior
    assert not Hpa(1, 10, None, None).has_behavior


@given(json_values(["scaleUp", "scaleDown", "policies", "type", "value", "periodSeconds",
                    "stabilizationWindowSeconds", "selectPolicy", "tolerance"]))
def test_any_behavior_is_rules_or_a_clear_error(doc: object) -> None:
    message = ""
    try:
        parse_behavior(json.dumps(doc))
    except ConfigError as exc:
        message = str(exc)
    assert not message or message.startswith("behavior")
