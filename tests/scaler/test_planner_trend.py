"""The planner's growth forecasts, checked against hand-computed values: the load's and
the KV cache's growth over a start-up, their caps, and what a planner just started reads."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from gpuscale.scaler.core.planner import Planner, PlannerConfig
from tests.scaler.planner_load import CFG, busy, run


def test_growth_over_a_start_up_is_planned_for() -> None:
    cfg = PlannerConfig(startup_s=100.0, memory_s=60.0, burst_s=30.0, utilization=0.8)
    p = Planner(cfg)
    for t in range(400):  # work rising 0.01 replica-seconds per second, every second
        p.observe(float(t), busy(1.0 + 0.01 * t, ready=5))
    plan = p.current(399.0)
    # The last minute's mean is 1 + 0.01 x 369.5; the slope 0.01/s over a start-up of
    # 100 s adds 1.0 (below the cap of half the load); with room at utilization 0.8 (a
    # quarter of the work up to 2 replicas' worth, a quarter of sqrt(2 x work) beyond).
    work = 1 + 0.01 * 369.5 + 1.0
    assert plan.steady == pytest.approx(work + 0.25 * math.sqrt(2 * work))
    assert plan.growth == pytest.approx(1.0)
    flat = Planner(PlannerConfig(startup_s=100.0, trend=False, utilization=0.8))
    for t in range(400):
        flat.observe(float(t), busy(1.0 + 0.01 * t, ready=5))
    work = 1 + 0.01 * 369.5
    assert flat.current(399.0).steady == pytest.approx(work + 0.25 * math.sqrt(2 * work))


def test_a_filling_kv_cache_is_planned_for_a_start_up_ahead() -> None:
    """Long generations fill the cache over minutes while the work per second stays low:
    the kv term counts the fill's growth over a start-up (100 s here), as steady does the
    load's, at most half the current use."""
    p = Planner(CFG)
    for t in range(400):  # 3 Ready pods' KV use rising 0.1 point per second, flat work
        p.observe(float(t), busy(0.3, ready=3, kv=60.0 + 0.1 * t))
    plan = p.current(399.0)
    now = 60.0 + 0.1 * 399
    assert plan.kv == pytest.approx((now + 0.1 * 100) / 90.0)
    assert plan.kv_growth == pytest.approx(10.0)
    assert plan.terms()["kv_growth"] == pytest.approx(10.0)
    assert plan.unheld == 2  # (99.9 + 10) / 90 = 1.22, where the use alone gives 1.11
    flat = Planner(CFG)
    run(flat, range(400), busy(0.3, ready=3, kv=99.9))
    assert flat.current(399.0).kv == pytest.approx(99.9 / 90.0)
    off = Planner(replace(CFG, trend=False))
    for t in range(400):
        off.observe(float(t), busy(0.3, ready=3, kv=60.0 + 0.1 * t))
    assert off.current(399.0).kv == pytest.approx(now / 90.0)
    capped = Planner(replace(CFG, startup_s=3000.0))
    for t in range(400):
        capped.observe(float(t), busy(0.3, ready=3, kv=60.0 + 0.1 * t))
    assert capped.current(399.0).kv == pytest.approx(now * 1.5 / 90.0)


def test_a_planner_just_started_reads_the_cache_fill_from_two_minutes() -> None:
    """A workload ramping in when its planner starts (a new workload, a scaler restart)
    fills the cache in its first minutes: the fill is read from ``KV_TREND_MIN_S`` (120 s)
    seen, over what was seen; the load's growth waits for a whole ``TREND_S`` (300 s)."""
    p = Planner(CFG)
    for t in range(119):  # KV use rising 0.1 point per second, the work 0.001/s
        p.observe(float(t), busy(0.3 + 0.001 * t, ready=3, kv=60.0 + 0.1 * t))
    assert p.current(118.0).kv_growth == 0  # 119 s seen
    for t in range(119, 150):
        p.observe(float(t), busy(0.3 + 0.001 * t, ready=3, kv=60.0 + 0.1 * t))
        assert p.current(float(t)).kv_growth == pytest.approx(0.1 * 100)  # over a start-up
    plan = p.current(149.0)
    assert plan.kv == pytest.approx((60.0 + 0.1 * 149 + 10.0) / 90.0)
    assert plan.growth == 0  # the load's: not before 300 s


def test_growth_is_capped_at_half_the_load() -> None:
    p = Planner(PlannerConfig(startup_s=1000.0, utilization=0.8))
    for t in range(400):
        p.observe(float(t), busy(0.5 if t < 340 else 4.0, ready=5))
    plan = p.current(399.0)
    work = 4.0 * 1.5  # the last minute is all at 4.0, and half of it again
    assert plan.growth == pytest.approx(2.0)
    assert plan.steady == pytest.approx(work + 0.25 * math.sqrt(2 * work))
