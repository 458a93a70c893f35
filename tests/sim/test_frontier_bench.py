"""bench/bench_frontier.py's judgement of one load's sweep: what beats the planner's default,
whether its knob is monotone, and its curve against the baselines' within its reach."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from bench.bench_frontier import _curve, _read, judge, main
from bench.bench_knob_draws import main as knob_draws_main
from gpuscale.models.slo import DEFAULT_SLO
from gpuscale.sim.sweep import Sweep, SweepPoint, sweep_json


def _p(key: str, setting: float | None, hours: float, minutes: int,
       default: bool = False) -> SweepPoint:
    return SweepPoint(key, key, "k", setting, default, hours, minutes, 60)


PLANNER = [_p("planner", 0.6, 3.0, 0), _p("planner", 0.85, 2.0, 1, True),
           _p("planner", 1.0, 1.5, 3)]


def test_what_beats_the_default_by_its_margin() -> None:
    s = Sweep((*PLANNER,
               _p("aibrix-apa", 50, 1.95, 1, True),  # 2.5 % cheaper: inside the 3 %
               _p("queue-model", 2, 1.9, 1, True),  # 5 % cheaper: beats it
               _p("knative-kpa", 70, 1.0, 2, True),  # cheaper, more minutes: does not
               _p("aibrix-kpa", 40, 1.0, 0),  # not its default: not in this test
               _p("static", 2, 1.92, 0),  # 4 % cheaper: inside the 5 %
               _p("static", 1, 1.0, 1)), DEFAULT_SLO)
    v = judge("trace x2", True, s)
    assert v.planner == PLANNER[1]
    assert [p.key for p in v.online] == ["queue-model"]
    assert [p.setting for p in v.static] == [1]
    assert not v.on_frontier
    assert v.monotone


def test_a_knob_that_turns_back_is_not_monotone() -> None:
    back = (PLANNER[0], PLANNER[1], _p("planner", 1.0, 2.2, 0))
    assert not judge("x", False, Sweep(back, DEFAULT_SLO)).monotone


def test_the_curve_within_the_planners_reach_and_beyond_it() -> None:
    s = Sweep((*PLANNER,
               _p("static", 4, 4.0, 0),  # 0 minutes: within reach, dearer
               _p("aibrix-apa", 50, 1.8, 1, True),  # 1 minute: cheaper than the 2.0
               _p("cpu-hpa", None, 1.0, 9, True)), DEFAULT_SLO)  # past its reach
    v = judge("burst10 s1", False, s)
    assert v.curve_checked
    assert v.reach == (0, 3)
    assert not v.curve_ok
    said = _curve(v)
    assert said.startswith("+11% at 1 min")
    assert "cheaper at more minutes (cpu-hpa 1.00 / 9)" in said
    # Only a baseline reaching fewer minutes than the planner's fewest is named apart.
    fewer = Sweep((PLANNER[1], PLANNER[2], _p("static", 4, 4.0, 0)), DEFAULT_SLO)
    assert "fewer minutes only by baselines (static 4 4.00 / 0)" in _curve(
        judge("burst10 s1", False, fewer))
    assert _curve(judge("not a curve load", False, s)) == "-"


def test_a_json_run_judged_again_gives_the_same_verdict() -> None:
    s = Sweep((*PLANNER, _p("static", 2, 1.5, 0)), DEFAULT_SLO)
    again = _read({"tuned": False, **sweep_json(s)})
    assert again.points == s.points
    assert judge("x", False, again) == judge("x", False, s)


def test_a_saved_run_is_drawn_again_without_simulating(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    s = Sweep((*PLANNER, _p("static", 2, 1.5, 0)), DEFAULT_SLO)
    saved = tmp_path / "frontier.json"
    saved.write_text(json.dumps({"trace x2": {"tuned": True, "requests": 7,
                                              **sweep_json(s)}}))
    monkeypatch.setattr(sys, "argv", ["bench_frontier.py", "--from", str(saved),
                                      "--plots", str(tmp_path / "plots")])
    main()
    png = tmp_path / "plots" / "trace-x2.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| trace x2 (tuned) | 2.00 / 1 |" in capsys.readouterr().out


@pytest.mark.parametrize("bench", [main, knob_draws_main],
                         ids=["bench_frontier", "bench_knob_draws"])
def test_loads_are_named_as_printed_with_a_dash_for_a_space(
        monkeypatch: pytest.MonkeyPatch, bench: Callable[[], None]) -> None:
    # The patterns' own names have dashes: 'long-prompt-bursts-s2' is one load.
    monkeypatch.setattr(sys, "argv", ["bench", "--loads",
                                      "long-prompt-bursts-s2,trace x2,no-such-load"])
    with pytest.raises(SystemExit) as stop:
        bench()  # the unknown name stops it before any simulation
    said = str(stop.value)
    assert said.startswith("--loads: no load no-such-load;")
    assert "long-prompt-bursts-s2, " in said
