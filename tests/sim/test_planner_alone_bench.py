"""bench/bench_planner_alone.py's tables: one draw as before, several draws as each draw's
minutes and the mean - so a change is judged on more than draw 0's onsets."""

from __future__ import annotations

import pytest

from bench.bench_planner_alone import table


def test_one_draw_prints_each_load_and_the_sets_totals() -> None:
    lines = table("benchmark", [[("trace x1", 1.06, 0, 0), ("steps s1", 3.28, 4, 2)]])
    assert lines[3].split() == ["trace", "x1", "1.06", "0", "0"]
    assert lines[4].split() == ["steps", "s1", "3.28", "4", "2"]
    assert lines[5].split() == ["benchmark", "loads", "4.34", "4", "2"]


def test_several_draws_print_each_draws_minutes_and_the_means() -> None:
    draws = [[("reasoning s1", 4.6, 2, 0), ("ramp s1", 3.2, 0, 1)],
             [("reasoning s1", 5.0, 3, 0), ("ramp s1", 3.4, 1, 0)]]
    lines = table("fresh", draws)
    assert lines[3].split() == ["reasoning", "s1", "4.80", "2", "3", "0"]
    assert lines[4].split() == ["ramp", "s1", "3.30", "0", "1", "1"]
    total = lines[5]
    assert total.split()[:4] == ["fresh", "loads", "8.10", "3.0"]  # means of 7.8/2, 8.4/4
    assert "7.80 / 2  8.40 / 4" in total


def test_draws_of_other_loads_are_refused() -> None:
    with pytest.raises(ValueError, match="longer"):
        table("x", [[("a", 1.0, 0, 0)], [("a", 1.0, 0, 0), ("b", 1.0, 0, 0)]])
