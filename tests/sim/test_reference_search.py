"""The reference's search runs to convergence or says it did not: its state, its budget,
the step it ended at and when it last saved, in the table and the JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuscale.cli.simulate import parse_search_runs
from gpuscale.models.serving import ServingParams
from gpuscale.sim.reference import MIN_STEP_S, hindsight_reference
from gpuscale.sim.simulate import Result, run_policy
from gpuscale.traffic.trace import TraceRequest

FAST = ServingParams(cold_start_s=60.0, cold_start_spread=(45.0, 90.0))
# Busy for four minutes, then light: the search has replica-steps to give back.
LOAD = ([TraceRequest(t * 0.05, 3_000, 100) for t in range(4_800)]
        + [TraceRequest(240.0 + t * 5.0, 500, 50) for t in range(72)])


def _start() -> list[Result]:
    return [run_policy("six", LOAD, 600.0, FAST, static=6)]


def test_without_a_budget_it_runs_until_no_move_saves() -> None:
    ref = hindsight_reference(LOAD, 600.0, FAST, _start(), max_runs=None)
    assert ref.state == "converged"
    assert ref.complete
    assert ref.max_runs is None
    assert ref.step_s == MIN_STEP_S  # it ends only at the finest step
    assert ref.savings  # it saved on its start ...
    hours = [h for _, h in ref.savings]
    assert hours == sorted(hours, reverse=True)  # ... each saving below the one before
    assert hours[-1] == ref.result.gpu_hours
    assert ref.last_improvement is not None
    assert ref.last_improvement <= ref.runs
    assert "converged after" in ref.describe()
    # A budget of exactly the runs it took is enough: converged, not "stopped at budget".
    same = hindsight_reference(LOAD, 600.0, FAST, _start(), max_runs=ref.runs)
    assert (same.state, same.result.gpu_hours, same.runs) == ("converged",
                                                            ref.result.gpu_hours, ref.runs)


def test_a_budget_that_ends_it_early_is_said_plainly() -> None:
    full = hindsight_reference(LOAD, 600.0, FAST, _start(), max_runs=None)
    short = hindsight_reference(LOAD, 600.0, FAST, _start(), max_runs=3)
    assert short.runs == 3
    assert short.state == "budget"
    assert not short.complete
    assert short.result.gpu_hours >= full.result.gpu_hours
    said = short.describe()
    assert "stopped at its budget of 3 simulations before converging" in said
    assert "--search-runs" in said
    none = hindsight_reference(LOAD, 600.0, FAST, _start(), max_runs=0)
    assert (none.state, none.runs, none.savings, none.last_improvement) == ("budget", 0, (),
                                                                           None)
    assert "not searched (--search-runs 0)" in none.describe()


@pytest.mark.parametrize(("text", "want"), [("0", 0), ("400", 400), ("all", None),
                                            (" all ", None)])
def test_search_runs_option(text: str, want: int | None) -> None:
    assert parse_search_runs(text) == want


@pytest.mark.parametrize("text", ["-1", "1.5", "", "ALL", "1e3", "9" * 40, "4\x00", "٤"])
def test_search_runs_refused(text: str) -> None:
    with pytest.raises(ValueError, match="--search-runs: a count of at least 0, or all"):
        parse_search_runs(text)


def test_cli_says_whether_the_search_converged(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n" + "".join(
        f"{r.arrival_s},{r.input_tokens},{r.output_tokens}\n" for r in LOAD))

    def simulate(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gpuscale.cli", "simulate", "--trace",
                               str(trace), "--policies", "aibrix-apa,reference", *args],
                              capture_output=True, text=True, check=False, timeout=300)

    out = simulate("--search-runs", "all", "--json")
    assert out.returncode == 0, out.stderr
    ref = json.loads(out.stdout)["reference"]
    assert (ref["search_state"], ref["search_complete"], ref["search_budget"]) == (
        "converged", True, None)
    assert ref["search_savings"][-1]["run"] == ref["search_last_improvement_run"]
    assert ref["search_step_s"] == MIN_STEP_S
    text = simulate("--search-runs", "2")
    assert text.returncode == 0, text.stderr
    assert "stopped at its budget of 2 simulations before converging" in text.stdout
    bad = simulate("--search-runs", "lots")
    assert bad.returncode == 2
    assert "--search-runs: a count" in bad.stderr
