"""The HPA model against hand-computed cases from the documented algorithm, and properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
)


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


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 5000), st.integers(0, 40)), min_size=1, max_size=40),
       st.integers(1, 5), st.integers(5, 30))
def test_properties(loads: list[tuple[float, int]], lo: int, hi: int) -> None:
    """Never outside [min, max]; a scale-down never goes below the largest recommendation
    of the last 300 s (the stabilization window), clamped to the bounds."""
    hpa = Hpa(lo, hi)
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
