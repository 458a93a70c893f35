"""gpuscale simulate --sweep (``sim.sweep``): every policy over its own knob, the frontier,
the planner against the best other policy - on small loads (seconds)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuscale.models.serving import ServingParams, needed_replicas
from gpuscale.models.slo import DEFAULT_SLO
from gpuscale.sim.compare import POLICIES, compare
from gpuscale.sim.sweep import (
    KNOBS,
    STATIC_ABOVE,
    STATIC_BELOW,
    Sweep,
    SweepPoint,
    pareto,
    sweep,
    tasks,
)
from gpuscale.traffic.patterns import synthetic
from gpuscale.traffic.trace import TraceRequest

FAST = ServingParams(cold_start_s=60.0, cold_start_spread=(45.0, 90.0))
LOAD = synthetic("bursts", 300.0, 15.0, seed=2)


def _p(key: str, hours: float, minutes: int, setting: float | None = None) -> SweepPoint:
    return SweepPoint(key, key, "k", setting, False, hours, minutes, 10)


def test_pareto_keeps_what_nothing_beats() -> None:
    a, b, c = _p("x", 1.0, 5), _p("x", 2.0, 0), _p("x", 1.5, 5)  # c: beaten by a
    d = _p("x", 3.0, 0)  # beaten by b
    e = _p("x", 1.0, 6)  # beaten by a (as cheap, more minutes)
    assert pareto([c, d, b, e, a]) == [a, b]
    assert pareto([]) == []


def test_levels_compare_the_planner_with_the_cheapest_other_at_no_more_minutes() -> None:
    s = Sweep((_p("planner", 2.0, 0, 0.6), _p("planner", 1.0, 3, 1.0),
               _p("static", 1.6, 0, 3), _p("aibrix-apa", 0.5, 4, 50)), DEFAULT_SLO)
    rows = {r.slo_minutes: r for r in s.levels()}
    assert sorted(rows) == [0, 3, 4]
    assert (rows[0].planner, rows[0].baseline) == (s.points[0], s.points[2])
    assert rows[0].gap == pytest.approx(2.0 / 1.6 - 1)
    assert rows[3].planner == s.points[1]
    assert rows[3].gap == pytest.approx(1.0 / 1.6 - 1)  # at <= 3 minutes: static 3 still
    assert rows[4].baseline == s.points[3]
    assert s.frontier == [s.points[3], s.points[1], s.points[2]]


def test_tasks_sweep_each_knob_and_static_counts_around_the_peak() -> None:
    got = tasks(LOAD, 360.0, FAST)
    for key, knob in KNOBS.items():
        assert [s for k, s in got if k == key] == list(knob.settings)
        assert knob.default in knob.settings  # the documented default is one of the runs
    peak = max(needed_replicas(LOAD, 360.0, FAST))
    assert [s for k, s in got if k == "static"] == [
        float(n) for n in range(max(1, peak - STATIC_BELOW), peak + STATIC_ABOVE + 1)]
    assert {k for k, s in got if s is None} == set(POLICIES) - set(KNOBS) - {"static"}
    with pytest.raises(ValueError, match="not a policy a sweep runs"):
        tasks(LOAD, 360.0, FAST, ["reference"])


def test_a_sweeps_defaults_are_what_simulate_shows() -> None:
    keys = ("planner", "aibrix-apa", "cpu-hpa")
    s = sweep(LOAD, 360.0, FAST, keys=keys)
    assert len(s.points) == len(tasks(LOAD, 360.0, FAST, keys))
    shown = compare(LOAD, 360.0, FAST, shown=keys)
    for r in shown.results:
        default = next(p for p in s.points if p.policy == r.policy and p.default)
        assert (default.gpu_hours, default.slo_minutes) == (r.gpu_hours,
                                                            r.slo_violation_minutes)
    # Worker processes give the same runs, in the same order.
    assert sweep(LOAD, 360.0, FAST, keys=keys, jobs=2).points == s.points
    seen: list[float] = []
    sweep(LOAD, 360.0, FAST, keys=("cpu-hpa", "static"),
          progress=lambda what, f: seen.append(f))
    assert seen == sorted(seen)
    assert seen[-1] == 1.0


def test_trigger_keys_given_to_a_sweep_reach_every_planner_run() -> None:
    from gpuscale.sim.compare import opening, policy_runs
    from gpuscale.sim.simulate import run_policy

    keys = {"startupSeconds": "30", "memorySeconds": "60"}
    s = sweep(LOAD, 360.0, FAST, keys=("planner",), planner_metadata=keys)
    start = opening(LOAD, 360.0, FAST)
    for point in s.points:  # the knob still swept, the keys on top
        kwargs = dict(dict(policy_runs(FAST, LOAD, DEFAULT_SLO, 1, start, **keys,
                                       utilization=f"{point.setting:g}"))["planner"])
        name = kwargs.pop("name")
        run = run_policy(name, LOAD, 360.0, FAST, slo=DEFAULT_SLO, **kwargs)
        assert (point.gpu_hours, point.slo_minutes) == (run.gpu_hours,
                                                        run.slo_violation_minutes)
    plain = sweep(LOAD, 360.0, FAST, keys=("planner",))
    assert [p.gpu_hours for p in plain.points] != [p.gpu_hours for p in s.points]


def _simulate(trace: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuscale.cli", "simulate", "--trace",
                           str(trace), *args], capture_output=True, text=True, check=False,
                          timeout=300)


def _trace(tmp_path: Path, requests: list[TraceRequest]) -> Path:
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n" + "".join(
        f"{r.arrival_s},{r.input_tokens},{r.output_tokens}\n" for r in requests))
    return trace


def test_cli_sweep_table_json_and_plot(tmp_path: Path) -> None:
    trace = _trace(tmp_path, LOAD)
    plot = tmp_path / "sweep.png"
    out = _simulate(trace, "--sweep", "--policies", "planner,static,reference",
                    "--json", "--plot", str(plot))
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert {r["key"] for r in got["runs"]} == {"planner", "static"}  # no reference swept
    assert len([r for r in got["runs"] if r["key"] == "planner"]) == len(
        KNOBS["planner"].settings)
    assert got["frontier"]
    assert all(row["planner"] is not None or row["best_other"] is not None
               for row in got["planner_vs_best_other"])
    assert plot.stat().st_size > 10_000
    text = _simulate(trace, "--sweep", "--policies", "planner,aibrix-apa", "--jobs", "2")
    assert text.returncode == 0, text.stderr
    assert "The planner's curve against the best other policy's" in text.stdout
    assert "utilization 0.85" in text.stdout


@pytest.mark.parametrize(("args", "says"), [
    (("--sweep", "--jobs", "0"), "--jobs: 1 to 64"),
    (("--sweep", "--jobs", "100000"), "--jobs: 1 to 64"),
    (("--sweep", "--policies", "reference,bound"), "--sweep: name at least one policy"),
])
def test_cli_sweep_refusals(args: tuple[str, ...], says: str, tmp_path: Path) -> None:
    out = _simulate(_trace(tmp_path, [TraceRequest(1.0, 100, 10)]), *args)
    assert out.returncode == 2
    assert says in out.stderr
    assert "Traceback" not in out.stderr
