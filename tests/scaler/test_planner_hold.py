"""The planner's scale-down hold (``scaler.core.hold``): a load that falls smoothly is held
at its level now, a dip in a noisy one and a fresh step down are held, and what the fall
let go is not asked for again by the past."""

from __future__ import annotations

import math
from dataclasses import replace

from gpuscale.scaler.core.hold import BUCKET_S, FALL_AGREE, Hold, smooth_fall
from gpuscale.scaler.core.planner import Plan, Planner
from gpuscale.scaler.core.trend import fall
from gpuscale.scaler.core.windows import Window
from tests.scaler.planner_load import CFG, busy, run

SLOW = replace(CFG, startup_s=300.0)  # a hold of 300 s, the default trend window's length


def _plans(p: Planner, loads: dict[int, float], ready: int) -> dict[int, Plan]:
    return {t: p.observe(float(t), busy(load, ready=ready)) for t, load in loads.items()}


def test_a_smooth_decline_is_held_at_its_level_now_not_a_start_up_ago() -> None:
    """6 replica-seconds/s falling 0.3 a minute: once both slopes show it, the plan is the
    count of the load that is here (its ``held``), not the count of 300 s ago the hold of
    the window's own counts kept (at t=1000, 4 replicas for 3.0 where 4.5 needed 6)."""
    p = Planner(SLOW)
    run(p, range(0, 400), busy(6.0, ready=8))
    plans = _plans(p, {t: 6.0 - 0.005 * (t - 400) for t in range(400, 1400)}, ready=8)
    for t in range(700, 1400):
        assert plans[t].replicas == max(plans[t].held, plans[t].unheld), t
    for t in (1000, 1200, 1399):
        assert plans[t].replicas < plans[t - 300].held
    assert (plans[1000].replicas, plans[700].held) == (4, 6)


def test_a_dip_in_a_noisy_load_keeps_the_count_of_its_level() -> None:
    """A load of 3 wavering +-0.3 (a 90-s period) dips to 2.4 over 5 minutes and comes
    back in 2: the work of the wave's crests stands above the fitted fall, so the level's
    4 replicas are kept through the dip although the load at its bottom needs 3."""
    p = Planner(SLOW)

    def load(t: int) -> float:
        base = 3.0 - 0.6 * min(max(t - 800, 0), 300) / 300
        if t >= 1100:
            base = min(3.0, 2.4 + 0.6 * (t - 1100) / 120)
        return base + 0.3 * math.sin(2 * math.pi * t / 90)

    plans = _plans(p, {t: load(t) for t in range(0, 1300)}, ready=4)
    assert min(plans[t].held for t in range(1050, 1130)) == 3
    assert all(plans[t].replicas >= 4 for t in range(700, 1300))


def test_a_step_down_is_held_while_its_half_window_falls_faster() -> None:
    """4 -> 0.4 at t=600: the last half of the trend window falls more than twice as
    fast as the whole for the step's first 100 s, so no fall is taken and the whole hold
    keeps the 5 replicas; the step is let go from when the two slopes agree."""
    p = Planner(SLOW)
    run(p, range(0, 600), busy(4.0, ready=5))
    plans = _plans(p, dict.fromkeys(range(600, 700), 0.4), ready=5)
    assert all(plan.replicas == 5 for plan in plans.values())
    assert plans[699].unheld == 1
    n = SLOW.bins(300)
    assert -p._arrived.slope(n // 2) > FALL_AGREE * -p._arrived.slope(n) > 0
    assert fall(p.config, p._arrived) == 0.0


def test_what_the_fall_let_go_is_not_asked_for_again_by_the_past() -> None:
    """A decline that ends in a load wavering round its new level: the fall comes and goes
    with the wave, and a count is never raised by the work the fall let go - only by the
    work of the second itself (a plan above the last one is the load's own, never the
    hold's)."""
    p = Planner(SLOW)
    run(p, range(0, 400), busy(6.0, ready=8))
    loads = {t: max(2.0, 6.0 - 0.01 * (t - 400)) + 0.4 * math.sin(2 * math.pi * t / 150)
             for t in range(400, 2000)}
    plans = _plans(p, loads, ready=8)
    for t in range(401, 2000):
        if plans[t].replicas > plans[t - 1].replicas:
            assert plans[t].replicas <= max(plans[t].held, plans[t].unheld), t
    assert plans[1999].replicas < 8


def test_without_a_fall_the_hold_is_the_largest_count_of_its_window() -> None:
    hold = Hold()
    counts = [hold.keep(t, 100, 0, work, 0.0, lambda w: w)
              for t, work in enumerate([5.0] + [1.0] * 150)]
    # the 5 is kept 100 bins - its bucket's last bin (9) leaves at 110, never sooner
    assert counts[:100] == [5] * 100
    assert counts[100 + BUCKET_S:] == [1] * (151 - 100 - BUCKET_S)
    others = [hold.keep(200 + t, 30, 7 if t == 0 else 2, 1.0, 0.5, lambda w: w)
              for t in range(40)]
    assert others[:30] == [7] * 30  # the other terms' counts: held whatever the fall
    assert others[30:] == [2] * 10


def test_a_smooth_fall_is_one_the_whole_window_and_its_half_agree_on() -> None:
    line, step, rising = Window(300, slopes=True), Window(300, slopes=True), Window(
        300, slopes=True)
    for t in range(300):
        line.push(10.0 - 0.01 * t)
        step.push(10.0 if t < 250 else 1.0)
        rising.push(1.0 + 0.01 * t)
    assert math.isclose(smooth_fall(line, 300), 0.01)
    assert smooth_fall(step, 300) == 0.0  # its half falls > 2x as fast as the whole
    assert smooth_fall(rising, 300) == 0.0
