"""The planner's drain floor: a scale-down cuts at most CUT_SHARE of the requests the
removed pods run, and waits for the minutes it cut."""

from __future__ import annotations

import math
from dataclasses import replace
from itertools import pairwise

import pytest

from gpuscale.scaler.core.planner import (
    Observation,
    Planner,
)
from tests.scaler.planner_load import CFG, busy, run


def _long(ready: int, fraction: float, *, running: float, finished: float) -> Observation:
    return busy(fraction, ready=ready, running=running, finished=finished)


def _share(request_s: float, drain_s: float = 30.0) -> float:
    """Of a minute's requests, what removing every pod cuts (the module's formula)."""
    return math.exp(-drain_s / request_s) * request_s / 60 * (1 - math.exp(-60 / request_s))


def test_a_scale_down_cuts_at_most_the_cut_share_of_long_requests() -> None:
    """Requests that run 200 s (100 running, 0.5 finishing a second) outlive a 30-s
    grace: removing one of 5 pods would cut ~15 % of a minute's requests, so the plan
    keeps the 5 Ready pods while they run, however far the load falls."""
    p = Planner(CFG)  # memory 600 s, hold 100 s
    run(p, range(0, 300), _long(5, 4.0, running=100.0, finished=0.5))
    run(p, range(300, 1200), _long(5, 0.4, running=100.0, finished=0.5))
    plan = p.current(1199.0)
    assert plan.request_s == pytest.approx(200.0)
    assert _share(200.0) / 5 > 0.02
    assert plan.unheld == 1
    assert plan.drain_floor == 5
    assert plan.replicas == 5
    assert plan.terms()["drain_floor"] == 5.0
    # Nothing running: nothing to cut.
    run(p, range(1200, 1201), _long(5, 0.0, running=0.0, finished=0.5))
    assert p.current(1200.0).drain_floor == 0
    # Chat-length requests (2 s) end within the grace: the plan goes down freely.
    short = Planner(CFG)
    run(short, range(0, 300), _long(5, 4.0, running=10.0, finished=5.0))
    run(short, range(300, 1200), _long(5, 0.4, running=10.0, finished=5.0))
    assert (short.current(1199.0).replicas, short.current(1199.0).drain_floor) == (1, 0)
    # A grace longer than the requests (drainSeconds with terminationGracePeriodSeconds).
    graced = Planner(replace(CFG, drain_s=1800.0))
    run(graced, range(0, 300), _long(5, 4.0, running=100.0, finished=0.5))
    run(graced, range(300, 1200), _long(5, 0.4, running=100.0, finished=0.5))
    assert graced.current(1199.0).replicas == 1


def test_twenty_second_requests_step_down_a_pod_a_minute() -> None:
    """Requests of 20 s on 5 pods and a 30-s grace: one pod of 5 cuts 1.4 % of a
    minute's requests (within 2 %), two would cut 2.8 %: one pod at a time, a minute
    apart (the minute whose requests a step cut is over before the next), down to the
    3 pods of which one would cut 2.4 % - kept while requests run."""
    assert _share(20.0) / 5 < 0.02 < 2 * _share(20.0) / 5
    assert _share(20.0) / 4 < 0.02 < _share(20.0) / 3
    p = Planner(CFG)
    run(p, range(0, 300), _long(5, 4.0, running=20.0, finished=1.0))
    ready, steps = 5, []
    for t in range(300, 900):
        plan = p.observe(float(t), _long(ready, 0.4, running=20.0, finished=1.0))
        if plan.replicas < ready:  # the HPA removes them at once
            steps.append((t, ready - plan.replicas))
            ready = plan.replicas
    assert [n for _, n in steps] == [1, 1]
    assert all(b - a >= 60 for (a, _), (b, _) in pairwise(steps))
    assert ready == 3
    assert p.current(899.0).drain_floor == 3


def test_a_large_fleet_steps_down_by_the_cut_share_and_waits_for_the_cut_minutes() -> None:
    """100 Ready pods, 200-s requests, 30-s grace: a step of m pods cuts m/100 x 74 % of a
    minute's requests, so 2 % allows 2 pods; then none until the requests that step cut
    would have ended (200 s)."""
    p = Planner(CFG)
    run(p, range(0, 300), _long(100, 80.0, running=4000.0, finished=20.0))  # 100 planned
    t = 300
    while p.observe(float(t), _long(100, 7.0, running=4000.0, finished=20.0)).replicas == 100:
        t += 1
    first = p.current(float(t)).replicas
    assert 100 - math.floor(0.02 * 100 / _share(200.0)) <= first < 100
    # The HPA removes them; those left run on while the cut requests would have run.
    run(p, range(t + 1, t + 200), _long(first, 7.0, running=4000.0, finished=20.0))
    assert p.current(t + 199.0).replicas == first
    assert p.current(t + 199.0).drain_floor == first
    p.observe(t + 200.0, _long(first, 7.0, running=4000.0, finished=20.0))
    allowed = math.floor(0.02 * first / _share(200.0))
    assert p.current(t + 200.0).replicas == first - allowed


def test_the_wait_after_a_step_follows_the_pods_not_an_old_count() -> None:
    """A wait begun on 10 Ready pods must not let a fleet that grew to 40 fall to the old
    step's count: with pods added the floor is the new fleet's."""
    p = Planner(CFG)
    run(p, range(0, 300), _long(10, 8.0, running=2000.0, finished=10.0))  # 200-s requests
    run(p, range(300, 600), _long(10, 0.8, running=2000.0, finished=10.0))
    assert p.current(599.0).replicas == 10  # one pod of 10 would cut 7 %
    run(p, range(600, 900), _long(40, 32.0, running=8000.0, finished=40.0))
    for t in range(900, 1000):
        plan = p.observe(float(t), _long(40, 3.2, running=8000.0, finished=40.0))
        assert plan.replicas >= 40 - math.floor(0.02 * 40 / _share(200.0)), t


def test_requests_running_with_few_finished_still_keep_their_pods() -> None:
    """3 requests running and 4.5 finishing in 5 minutes (200-s runs): too few for a
    mean request's work, enough for Little's law; with none finished, at least the
    window. Before a minute is seen, the pods that run requests are kept."""
    p = Planner(replace(CFG, hold_s=0.0))
    p.observe(0.0, _long(5, 0.1, running=3.0, finished=0.015))
    first = p.current(0.0)
    assert math.isnan(first.request_s)
    assert math.isnan(first.terms()["request_s"])
    assert first.replicas == 5
    run(p, range(1, 600), _long(5, 0.1, running=3.0, finished=0.015))
    plan = p.current(599.0)
    assert plan.request_s == pytest.approx(200.0)
    assert plan.replicas == 5
    none = Planner(replace(CFG, hold_s=0.0))
    run(none, range(0, 600), _long(5, 0.1, running=3.0, finished=0.0))
    assert none.current(599.0).request_s == pytest.approx(3.0 * 300)
    assert none.current(599.0).replicas == 5


def test_a_warming_planner_does_not_start_the_wait_before_its_step() -> None:
    """Held at the Ready pods while warming, the planner takes no step, so the first
    step's wait starts when the step does: two steps are a request's run apart."""
    p = Planner(CFG)  # hold 100 s: warming for the first 100 s
    ready, steps = 100, []
    for t in range(0, 700):
        plan = p.observe(float(t), _long(ready, 7.0, running=4000.0, finished=20.0))
        if plan.replicas < ready:
            steps.append(t)
            ready = plan.replicas
    assert len(steps) >= 2
    assert steps[0] >= 100
    assert all(b - a >= 200 for a, b in pairwise(steps))
