"""bench/bench_knob_draws.py's verdict: the knob's monotony on the means of several
cold-start draws, and on each draw."""

from __future__ import annotations

from bench.bench_knob_draws import Run, verdicts


def _runs(load: str, draw: int, points: list[tuple[float, float, int]]) -> list[Run]:
    return [Run(load, s, draw, h, m) for s, h, m in points]


def test_a_reversal_in_one_draw_is_the_draws_when_the_means_are_monotone() -> None:
    runs = (_runs("a", 0, [(0.6, 3.0, 0), (0.85, 2.0, 2), (1.0, 1.5, 1)])  # turns back
            + _runs("a", 1, [(0.6, 3.0, 0), (0.85, 2.0, 0), (1.0, 1.5, 3)]))
    (v,) = verdicts(runs)
    assert v.mean_monotone  # minutes 0, 1, 2 on the means
    assert (v.draws_monotone, v.draws) == (1, 2)
    assert v.means == ((0.6, 3.0, 0.0), (0.85, 2.0, 1.0), (1.0, 1.5, 2.0))


def test_hours_that_rise_with_the_knob_on_the_means_are_the_planners() -> None:
    runs = (_runs("b", 0, [(0.6, 3.0, 0), (0.85, 2.0, 1), (1.0, 2.5, 1)])
            + _runs("b", 1, [(0.6, 3.0, 0), (0.85, 2.0, 1), (1.0, 1.9, 1)])
            + _runs("c", 0, [(0.6, 2.0, 0), (1.0, 1.0, 0)]))
    b, c = verdicts(runs)
    assert (b.load, b.mean_monotone, b.draws_monotone) == ("b", False, 1)
    assert (c.load, c.mean_monotone, c.draws) == ("c", True, 1)


def test_only_draws_every_setting_ran_are_counted() -> None:
    runs = (_runs("d", 0, [(0.6, 3.0, 0), (1.0, 2.0, 1)])
            + _runs("d", 1, [(0.6, 9.0, 9)]))  # draw 1 lacks a setting
    (v,) = verdicts(runs)
    assert v.draws == 1
    assert v.means == ((0.6, 3.0, 0.0), (1.0, 2.0, 1.0))

