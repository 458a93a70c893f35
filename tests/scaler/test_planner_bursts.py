"""The planner's burst term: the delay bound of a constant-rate server over the remembered
history, and each burst's excess over the level it stood on."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import replace

import pytest

from gpuscale.scaler.core.planner import (
    Planner,
    PlannerConfig,
)
from tests.scaler.planner_load import CFG, REQUEST, busy, run


def test_a_first_burst_is_planned_for_kept_a_hold_then_forgotten() -> None:
    """A burst with none before it may be a one-off: planned for while it lasts and kept
    one hold (a start-up: 100 s here) after the spans that hold it, not the memory's 600 s
    (a one-off burst held for the memory is that many minutes of replicas for nothing)."""
    p = Planner(CFG)
    run(p, range(0, 200), busy(0.4))
    run(p, range(200, 205), busy(10.0))  # 5 s at 10 replica-seconds per second
    run(p, range(205, 206), busy(0.4))
    plan = p.current(205.0)
    # The worst interval is the 5-s burst plus 0.4/s on either side within the longest
    # span that still raises the rate: check the 5-s span alone is at least met, less the
    # share of its minute's work that may wait late (5 % of the 50 + 55 x 0.4).
    allowed = 0.05 * (50 + 55 * 0.4)
    assert plan.burst >= (50 - allowed) / (5 + 2 - allowed * 5 / 50)
    assert plan.replicas == math.ceil(plan.burst)
    # The 120-s spans hold it to 325; a hold after the largest excess they gave ...
    run(p, range(206, 300), busy(0.4))
    assert p.current(299.0).burst_excess > 6
    # ... then it is gone: the plan is the level's, long before the memory's 600 s.
    run(p, range(300, 450), busy(0.4))
    plan = p.current(449.0)
    assert plan.burst_excess == 0.0
    assert plan.replicas == 1


def test_a_burst_that_came_back_at_a_period_is_held_from_a_start_up_before_the_next() -> None:
    """Two bursts 600 s apart: the third is due 600 s after the second. Its excess is held
    from a start-up (100 s) and the jitter (5 % of the period) before it is due - not in
    between (nor for the memory after the second) - and while the due burst goes on its
    rise is no growth to plan for (its size is known)."""
    p = Planner(CFG)  # memory 600 s, hold and start-up 100 s
    level = busy(0.4, ready=8)
    run(p, range(0, 200), level)
    run(p, range(200, 205), busy(10.0, ready=8))
    run(p, range(205, 800), level)
    run(p, range(800, 805), busy(10.0, ready=8))
    run(p, range(805, 1260), level)  # 1400 is due: held from 1400 - 100 - 30 = 1270
    plan = p.current(1259.0)
    assert (plan.burst_excess, plan.replicas) == (0.0, 1)
    run(p, range(1260, 1400), level)
    plan = p.current(1399.0)
    assert plan.burst_excess > 6
    assert plan.replicas == math.ceil(plan.burst) >= 7
    run(p, range(1400, 1405), busy(10.0, ready=8))
    assert p.current(1404.0).growth == 0.0  # the burst that was due: no trend


def test_a_due_burst_that_does_not_come_ends_the_period() -> None:
    """Past the jitter after a due burst that did not come, the bursts have no period:
    the memory holds what it still holds (the last burst's excess within 600 s: whole for
    300 s, then less in a straight line) and the plan falls to the level once that is gone
    too."""
    p = Planner(CFG)
    level = busy(0.4, ready=8)
    run(p, range(0, 200), level)
    for start in (200, 500):
        run(p, range(start, start + 5), busy(10.0, ready=8))
        run(p, range(start + 5, start + 300), level)
    whole = p.current(799.0).burst_excess  # the due burst's, held from 670
    assert whole > 6
    run(p, range(800, 840), level)  # 800 was due: 815 is its jitter's end (5 % of 300)
    faded = [p.current(839.0).burst_excess]
    for start, end in ((840, 940), (940, 1040)):
        run(p, range(start, end), level)
        faded.append(p.current(end - 1.0).burst_excess)
    # The memory: the burst at ~504 for 600 s, ~335, ~435 and ~535 s old
    assert whole > faded[0] > faded[1] > faded[2] > 0
    assert faded[0] > 0.8 * whole
    assert faded[2] < 0.25 * whole
    assert faded[0] - faded[1] == pytest.approx(faded[1] - faded[2])  # a straight line
    run(p, range(1040, 1250), level)
    assert p.current(1249.0).burst_excess == 0.0


def test_bursts_at_random_gaps_have_no_period_once_a_third_disagrees() -> None:
    """Two bursts give a period; a third whose gap differs by more than 15 % from the
    last says the bursts come at no period: the memory holds for them again."""
    from gpuscale.scaler.core.recurrence import Recurrence

    def bursts(starts: tuple[int, ...]) -> Recurrence:
        r = Recurrence(CFG)
        for second in range(starts[-1] + 230):
            if any(start <= second < start + 30 for start in starts):
                r.see(second, 6.0, 7.0)
            else:
                r.see(second, 0.0, 1.0)
        return r

    assert bursts((100, 700)).period == (600, 0, 700, 6.0, 7.0)
    assert bursts((100, 700, 1290)).period == (600, 10, 1290, 6.0, 7.0)  # within 15 %
    assert bursts((100, 700, 1000)).period is None


def test_a_burst_tail_is_no_second_burst() -> None:
    """The spans hold a burst's excess for up to 120 s after it, fading: that tail is the
    same burst (it does not make the burst recur, nor give a period)."""
    from gpuscale.scaler.core.recurrence import Recurrence

    r = Recurrence(CFG)
    for second in range(0, 100):
        r.see(second, 0.0, 1.0)
    recurs = [r.see(second, 6.0, 7.0) for second in range(100, 130)]  # the burst
    for second, excess in zip(range(130, 250), range(120, 0, -1), strict=True):
        recurs.append(r.see(second, 6.0 * excess / 120, 1.0 + 6.0 * excess / 120))
    for second in range(250, 400):
        recurs.append(r.see(second, 0.0, 1.0))
    assert not any(recurs)
    assert len(r._ended) == 1
    assert r.period is None


def test_the_hold_keeps_arrivals_not_the_queue_a_burst_left() -> None:
    """While a queue drains, the pods serve more than arrives and their batches are full
    of it: what the hold keeps is the arrivals' load and the share of the running
    sequences the arrivals sustain (Little's law), not the drain's - while the plan is
    never below the work the pods are doing meanwhile."""
    cfg = replace(CFG, max_batch=16)
    p = Planner(cfg)
    finished = 1.0 / REQUEST  # one replica-second of requests finish each second
    run(p, range(0, 299), busy(1.0, running=4.0, ready=5, finished=finished))
    # 4,430 requests arrive (4 x 60 replica-seconds) and drain in a minute on 5 busy pods
    # while 1 replica-second arrives each second: batches full, 80 running (5 x the
    # arrivals': they sustain a fifth of it)
    queue = 4 * 60 / REQUEST
    run(p, range(299, 300), busy(1.0, waiting=queue, running=4.0, ready=5,
                                 finished=finished))
    for t in range(300, 360):
        run(p, range(t, t + 1), busy(5.0, waiting=queue * (359 - t) / 60, running=80.0,
                                     ready=5, finished=5 * finished))
    plan = p.current(359.0)
    assert plan.replicas >= 5  # the work the pods do now
    # held: the arrivals' 1/s (1.25 at 0.8) and the batch they sustain (80 x 0.2 / 12.8),
    # not the drain's 5 replica-seconds nor its 80 / 12.8 = 6.25 replicas of batch
    assert plan.concurrency == pytest.approx(80 / (16 * 0.8))
    assert plan.held == 2


def test_the_burst_term_follows_the_level_down_unheld() -> None:
    """The burst term is the level plus the remembered excess; as the level falls the
    term falls with it, and the hold does not keep its old height (its memory keeps the
    excess: holding the term too kept the count of a level left behind a start-up more).
    A memory shorter than the hold is held, as any load that is here."""
    p = Planner(CFG)  # hold 100 s, memory 600 s
    for t in range(0, 900):  # level 4/s, and every 5 min a 5-s burst of +6/s
        run(p, range(t, t + 1), busy(10.0 if t % 300 < 5 else 4.0, ready=5))
    run(p, range(900, 905), busy(1.0, ready=5))  # the level falls to a quarter
    before = p.current(904.0)
    assert before.replicas == math.ceil(before.burst) == 7  # the level's 4 and the excess
    run(p, range(905, 1000), busy(1.0, ready=5))
    plan = p.current(999.0)  # within the hold of that 7
    assert plan.burst == pytest.approx(plan.steady * CFG.utilization + plan.burst_excess)
    # The level's 1 and the excess of the burst at 600 (the one due at 900 did not come:
    # no period), 400 s old in a memory of 600: two thirds of it
    excess = before.burst - before.steady * CFG.utilization
    assert plan.burst_excess == pytest.approx(excess * 2 / 3, rel=0.05)
    assert plan.unheld == math.ceil(plan.burst) == 3
    # The hold keeps the load that was here (4/s over 0.8 busy: 5), not the burst's 7.
    assert plan.replicas == 5
    short = Planner(replace(CFG, memory_s=50.0))
    run(short, range(0, 300), busy(0.4))
    run(short, range(300, 305), busy(10.0))
    run(short, range(305, 480), busy(0.4))  # the burst's spans fade by 425
    assert short.current(479.0).replicas > 1  # held 100 s from there
    run(short, range(480, 560), busy(0.4))
    assert short.current(559.0).replicas == 1


def test_the_burst_term_is_the_delay_bound_of_a_constant_rate_server() -> None:
    p = Planner(PlannerConfig(delay_s=3.0, memory_s=600.0, late_share=0.0))
    run(p, range(0, 10), busy(0.0))
    run(p, range(10, 11), busy(8.0))  # one second of 8 replica-seconds
    run(p, range(11, 20), busy(0.0))
    # c must satisfy 8 <= c * (1 + 3) for the 1-s interval; every longer interval holding
    # it needs less.
    assert p.current(19.0).burst == pytest.approx(8 / 4)


def test_a_clump_the_percentile_absorbs_is_no_burst_sustained_excess_is() -> None:
    """The objective is a p95 per minute: a clump whose overflow past the delay bound is
    within 5 % of the minute's work leaves the minute within it, so the burst term plans
    for what the percentile cannot absorb. A one-second clump of 3 replica-seconds every
    20 s on 0.5/s after a minute of it (0.625/s on average): the strict bound asks
    3 / (1 + 2) = 1 for the clump; with the late share, no more than the mean. 30 s at 3/s
    (a queue that stands for the whole span): the late share barely changes the bound."""
    def clumps(late_share: float) -> float:
        p = Planner(replace(CFG, late_share=late_share))  # delay 2 s
        for t in range(0, 600):
            run(p, range(t, t + 1), busy(3.0 if t % 20 == 0 and t >= 60 else 0.5, ready=1))
        return p.current(599.0).burst

    assert clumps(0.0) == pytest.approx(1.0)
    assert clumps(0.05) <= 0.625

    def sustained(late_share: float) -> float:
        p = Planner(replace(CFG, late_share=late_share))
        run(p, range(0, 300), busy(0.5, ready=1))
        run(p, range(300, 330), busy(3.0, ready=1))
        run(p, range(330, 400), busy(0.5, ready=1))
        return p.current(399.0).burst

    assert sustained(0.05) > 0.97 * sustained(0.0)


def test_a_long_gap_does_not_turn_the_queue_into_a_burst() -> None:
    p = Planner(CFG)
    run(p, range(0, 100), busy(1.0, ready=2))
    p.observe(160.0, busy(1.0, waiting=300.0, ready=2))  # 60 s unseen: history restarts
    plan = p.current(160.0)
    assert plan.arrived == pytest.approx(1.0)  # the queue is the backlog term's
    assert plan.backlog == pytest.approx(300 * REQUEST / 100.0)


def test_burst_memory_is_bounded_by_buckets() -> None:
    p = Planner(PlannerConfig(memory_s=900.0))
    for t in range(2000):  # a slow decline: every second a new, lower rate
        p.observe(float(t), busy(max(0.1, 20.0 - 0.01 * t), ready=20))
    assert len(p._bursts.rates) <= 900 // 10 + 2


def test_a_burst_keeps_its_excess_over_the_level_not_the_old_level() -> None:
    """Headroom for the workload's own bursts, not for a level it has left: after a busy
    hour with 5-s bursts on top, the load falls to a fifth; the burst term follows the
    new level plus the bursts' excess, not the old level's rate for the memory's span."""
    p = Planner(CFG)  # memory 600 s
    for t in range(0, 1200):  # level 4/s, and every 5 min a 5-s burst of +6/s
        run(p, range(t, t + 1), busy(10.0 if t % 300 < 5 else 4.0, ready=5))
    plan = p.current(1199.0)
    high = plan.burst
    assert plan.burst_excess > 0
    run(p, range(1200, 1500), busy(0.8, ready=5))  # 5 minutes at a fifth of the level
    plan = p.current(1499.0)
    # The remembered rate (the old level with a burst: above 4) is still in memory ...
    assert p._bursts.rates[0][1] > 4.0
    # ... but the term is the level now plus the excess the bursts showed.
    assert plan.burst == pytest.approx(0.8 + plan.burst_excess)
    assert plan.burst < high


def test_bursts_that_recur_within_the_window_are_not_hidden_in_their_level() -> None:
    """A level taken as the window's mean would rise with bursts that come every few
    minutes and shrink their excess; the quietest minute does not: between two bursts
    the term still carries the whole burst."""
    cfg = replace(CFG, memory_s=900.0)
    p = Planner(cfg)
    for t in range(0, 1800):  # level 1/s, a 90-s burst at 6/s every 4 minutes
        run(p, range(t, t + 1), busy(6.0 if t % 240 < 90 else 1.0, ready=6))
    plan = p.current(1799.0)  # 150 s after the last burst began: quiet for 60 s
    absolute = p._bursts.rates[0][1]
    assert plan.burst == pytest.approx(absolute)  # level + excess >= the burst's own rate


def test_a_step_the_load_keeps_is_its_level_not_a_burst_to_remember() -> None:
    """A step up that lasts 12 minutes is a new level: once the load has kept it for 5
    whole minutes it is no burst, and after the step back down the plan is the old
    level's, not the step's height held as headroom for the memory's span. A 2-minute
    burst on the same level is still remembered."""
    p = Planner(CFG)  # memory 600 s, hold 100 s, utilization 0.8
    run(p, range(0, 700), busy(1.0, ready=5))
    run(p, range(700, 1420), busy(4.0, ready=5))
    run(p, range(1420, 1800), busy(1.0, ready=5))
    plan = p.current(1799.0)
    assert plan.burst_excess == pytest.approx(0.0, abs=0.05)
    assert plan.replicas == math.ceil(1.0 / 0.8) == 2
    short = Planner(CFG)
    run(short, range(0, 700), busy(1.0, ready=5))
    run(short, range(700, 820), busy(4.0, ready=5))
    run(short, range(820, 830), busy(1.0, ready=5))
    plan = short.current(829.0)
    assert plan.burst_excess > 2.5  # 4/s over 120 s within the 2-s delay, over 1/s
    assert plan.replicas >= math.ceil(plan.burst) >= 4


def test_an_older_burst_with_a_higher_rate_outlives_a_newer_excess() -> None:
    """A newer excess as large but from a lower rate (its level had fallen) does not push
    out an older burst of a higher rate: when a level reaches the newer rate and forgets
    it, the older burst's excess still counts."""
    from gpuscale.scaler.core.bursts import remember

    memory: deque[tuple[int, float, float]] = deque()
    remember(memory, 0, 10.0, 20.0, 10, 900)  # a burst to 20 over a level of 10
    remember(memory, 100, 11.0, 12.0, 10, 900)  # to 12 over a level of 1
    assert [e[1] for e in memory] == [10.0, 11.0]
    remember(memory, 200, 12.0, 25.0, 10, 900)  # higher in both: the others go
    assert memory == deque([(200, 12.0, 25.0)])
    remember(memory, 205, 1.0, 2.0, 10, 900)  # same bucket, smaller: kept longer
    assert memory == deque([(205, 12.0, 25.0)])
    remember(memory, 1106, 0.5, 1.0, 10, 900)  # past the span
    assert memory == deque([(1106, 0.5, 1.0)])


def test_a_remembered_excess_fades_in_a_straight_line_after_half_its_memory() -> None:
    """``faded``: an excess whole for half the memory, half at three quarters, nothing at
    its end and after; a memory of one bin (the shortest ``memorySeconds`` allows) as
    well; of several, the largest once faded."""
    from gpuscale.scaler.core.bursts import faded

    def one(age: int, span: int) -> float:
        return faded([(1000 - age, 2.0, 5.0)], 1000, span) / 2.0

    assert [one(age, 600) for age in (0, 300, 450, 600, 700)] == [1.0, 1.0, 0.5, 0.0, 0.0]
    assert [one(age, 1) for age in (0, 1, 2)] == [1.0, 0.0, 0.0]
    # 4.0 seen 500 s ago holds 4 x 100 / 300; 1.0 seen now holds 1.0
    assert faded([(500, 4.0, 9.0), (1000, 1.0, 9.0)], 1000, 600) == pytest.approx(4 / 3)
    assert faded([], 1000, 600) == 0.0
