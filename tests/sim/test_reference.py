"""The hindsight reference: never worse than any policy it starts from, a schedule that
replays as the run it reports, and the least a hand-worked case allows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuscale.models.serving import ServingParams
from gpuscale.models.slo import SLO_SPECS, SloSpec
from gpuscale.sim.compare import (
    POLICIES,
    compare,
    format_comparison,
    parse_policies,
    static_peak,
)
from gpuscale.sim.reference import hindsight_reference
from gpuscale.sim.simulate import run_policy
from gpuscale.traffic.patterns import synthetic
from gpuscale.traffic.scale import scale_trace
from gpuscale.traffic.trace import TraceRequest, read_trace
from tests.support.repo import AZURE_CONV

TRACE = AZURE_CONV
FAST = ServingParams(cold_start_s=60.0, cold_start_spread=(45.0, 90.0))


def _key(r: object) -> tuple[int, float]:
    return (r.slo_violation_minutes, r.gpu_hours)  # type: ignore[attr-defined]


@pytest.mark.parametrize("load", ["trace x3", "bursts"])
def test_no_policy_beats_the_reference(load: str) -> None:
    if load == "bursts":
        requests = synthetic("bursts", 900.0, 20.0, seed=3)
    else:
        requests = scale_trace(read_trace(TRACE), rate=3.0, speedup=1.0, limit_s=900.0)
    found = compare(requests, 1200.0, FAST, shown=(*tuple(POLICIES), "reference", "bound"),
                    max_runs=60)
    ref = found.reference
    assert ref is not None
    assert found.bound is not None
    assert len(found.results) == len(POLICIES)
    for r in found.results:
        # Fewer SLO minutes than the reference, or as few for fewer GPU-hours: never.
        assert _key(r) >= (ref.result.slo_violation_minutes, ref.result.gpu_hours - 1e-9), \
            r.policy
        if r.slo_violation_minutes <= ref.result.slo_violation_minutes:
            gap = found.gap(r, "reference")  # (one missing more may cost less)
            assert gap is not None
            assert gap >= -1e-9
    assert ref.result.gpu_hours <= ref.start_gpu_hours
    if ref.result.slo_violation_minutes == 0:  # the optimum lies between the two
        assert found.bound.gpu_hours <= ref.result.gpu_hours


def test_every_policy_replays_as_it_ran() -> None:
    """What makes the reference's construction hold: a policy's own schedule, followed by
    ``run_policy(schedule=...)``, is the same run (draws, bill, minutes)."""
    requests = scale_trace(read_trace(TRACE), rate=4.0, speedup=1.0, limit_s=600.0)
    found = compare(requests, 780.0, FAST, shown=tuple(POLICIES))
    for r in found.results:
        again = run_policy("again", requests, 780.0, FAST, schedule=r.steps)
        assert again.steps == r.steps, r.policy
        assert again.gpu_hours == pytest.approx(r.gpu_hours, abs=1e-12), r.policy
        assert again.bad_minutes == r.bad_minutes, r.policy
        assert again.unserved == r.unserved, r.policy


def test_the_reference_replays_as_reported() -> None:
    requests = synthetic("steps", 900.0, 15.0, seed=2)
    starts = [run_policy("static", requests, 1000.0, FAST, static=6)]
    ref = hindsight_reference(requests, 1000.0, FAST, starts, max_runs=80)
    again = run_policy("again", requests, 1000.0, FAST, schedule=ref.result.steps)
    assert again.gpu_hours == pytest.approx(ref.result.gpu_hours)
    assert again.slo_violation_minutes == ref.result.slo_violation_minutes == 0
    # It removed replicas where the steps are low: far cheaper than six all the time.
    assert ref.result.gpu_hours < 0.8 * starts[0].gpu_hours


def test_a_light_load_needs_one_replica_all_the_time_and_no_more() -> None:
    # One short request every 10 s: one replica serves it all; none for a while would
    # leave requests waiting a cold start (far over 2 s). So the cheapest schedule is one
    # replica throughout, whatever the start: here four.
    requests = [TraceRequest(float(t), 500, 50) for t in range(0, 600, 10)]
    starts = [run_policy("four", requests, 600.0, FAST, static=4)]
    ref = hindsight_reference(requests, 600.0, FAST, starts, step_s=60.0, max_runs=200)
    assert ref.result.slo_violation_minutes == 0
    assert ref.complete
    assert set(ref.result.steps) == {1}
    assert ref.result.gpu_hours * 3600.0 == pytest.approx(600.0)


def test_a_run_past_its_allowance_stops_at_the_minute_it_is_known() -> None:
    # No replica from 60 s on: minute 1's arrivals are never served, which is certain
    # once more of them are late than a p95 lets through (at the end of minute 1 here).
    requests = [TraceRequest(float(t), 500, 50) for t in range(0, 300)]
    from gpuscale.sim.reference import _Watch  # the search's own stop rule

    arrivals = [60] * 5
    r = run_policy("gap", requests, 300.0, FAST, schedule=[1] * 60 + [0] * 240,
                   until=_Watch(SloSpec("ttft", 2.0), arrivals, allowed=0))
    assert r.stopped_at == 120.0
    assert r.slo_violation_minutes >= 1
    # Without the watch the whole window runs.
    whole = run_policy("gap", requests, 300.0, FAST, schedule=[1] * 60 + [0] * 240)
    assert whole.stopped_at is None
    assert whole.minutes == 5


def test_what_a_measure_will_be_at_least_never_exceeds_what_it_becomes() -> None:
    from gpuscale.models.serving import InFlightRequest

    waiting = InFlightRequest(10.0, 1_000, 50)
    admitted = InFlightRequest(10.0, 1_000, 50)
    admitted.admitted = 11.0  # in prefill at 14 s, first token still to come
    for kind in ("ttft", "queue", "ttft-per-token", "ttft-tpot"):
        slo = SloSpec(kind, 2.0)
        assert slo.at_least(waiting, 14.0) >= slo.at_least(waiting, 12.0)
    # A queue delay is fixed at admission: 1 s, not the 4 s a request waiting would have.
    assert SloSpec("queue", 2.0).at_least(admitted, 14.0) == pytest.approx(1.0)
    admitted.first_token = 14.5
    assert SloSpec("queue", 2.0).measure(admitted) == pytest.approx(1.0)
    assert SloSpec("ttft", 2.0).at_least(admitted, 14.0) <= SloSpec("ttft").measure(admitted)
    # Decoding: the pace so far is a floor under the TPOT it ends with.
    both = SloSpec("ttft-tpot", 2.0, tpot_s=0.02)
    seen = [both.at_least(admitted, t) for t in (15.0, 16.0, 17.0)]
    admitted.finished = 17.5  # 3 s for its 50 tokens: 60 ms each
    assert seen == sorted(seen)
    assert seen[0] == pytest.approx(4.5)  # its TTFT, while the pace is still within
    assert seen[-1] <= both.measure(admitted) == pytest.approx(3.0 / 50 * 2.0 / 0.02)
    # A request a drain cuts starts over: its pace so far says nothing of its last one,
    # but its first token now comes after the cut.
    cut = InFlightRequest(0.0, 100, 2)
    cut.admitted, cut.first_token = 0.0, 0.01
    loose = SloSpec("ttft-tpot", 40.0, tpot_s=0.1)
    before = loose.at_least(cut, 20.0)  # 10 s a token so far; 20 s since it arrived
    # cut at 30.5 s (serving.py's _end_drains), served again from 30.9 s
    cut.admitted, cut.first_token, cut.finished = 30.9, 31.0, 31.05
    assert before <= loose.measure(cut) == pytest.approx(31.0)


def test_static_at_the_hindsight_peak_is_the_fewest_that_meet_the_slo() -> None:
    requests = synthetic("steps", 900.0, 15.0, seed=2)
    best = static_peak(requests, 1000.0, FAST)
    n = best.max_replicas
    assert best.slo_violation_minutes == 0
    assert best.policy == f"static at hindsight peak ({n})"
    fewer = run_policy("fewer", requests, 1000.0, FAST, static=n - 1)
    assert fewer.slo_violation_minutes > 0


def test_the_bound_is_missing_for_objectives_it_does_not_hold_for() -> None:
    requests = synthetic("steps", 300.0, 5.0)
    found = compare(requests, 300.0, FAST, shown=("planner", "bound"),
                    slo=SloSpec("queue", 1.0))
    assert found.bound is None
    assert found.bound_missing is not None
    assert "time-to-first-token" in found.bound_missing
    # Bounding TPOT too only raises the optimum: the TTFT bound still lies below it.
    both = compare(requests, 300.0, FAST, shown=("planner", "bound"),
                   slo=SLO_SPECS["ttft-tpot"])
    assert both.bound is not None
    table = format_comparison(both)
    assert "p95 TPOT" in table.splitlines()[0]
    assert f"{both.results[0].p95_tpot_s * 1000:.0f}ms" in table.splitlines()[2]
    assert found.reference is None
    assert [r.policy for r in found.results] == ["gpuscale vllm-planner"]


def test_policies_are_parsed_with_a_clear_error() -> None:
    assert parse_policies("reference, planner") == ("planner", "reference")
    assert "bound" in parse_policies("all")
    with pytest.raises(ValueError, match=r"unknown orcale.*choose from planner"):
        parse_policies("planner,orcale")
    with pytest.raises(ValueError, match="none given"):
        parse_policies(" , ")


def _simulate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuscale.cli", "simulate", *args],
                          capture_output=True, text=True, check=False, timeout=120)


def test_cli_chooses_policies_and_carries_reference_and_bound(tmp_path: Path) -> None:
    trace = tmp_path / "mine.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n" + "".join(
        f"{t * 0.5},{800 + (t % 7) * 300},{120}\n" for t in range(600)))
    out = _simulate("--trace", str(trace), "--policies", "planner,aibrix-apa,reference,bound",
                    "--search-runs", "30", "--json")
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert [r["policy"] for r in got["policies"]] == ["gpuscale vllm-planner", "AIBrix APA"]
    assert got["requests"] == 600
    ref = got["reference"]
    assert ref["search_runs"] <= 30
    assert ref["slo_violation_minutes"] <= min(r["slo_violation_minutes"]
                                               for r in got["policies"])
    assert got["bound"]["gpu_hours"] > 0
    text = _simulate("--trace", str(trace), "--policies", "cpu-hpa,bound")
    assert text.returncode == 0, text.stderr
    assert "CPU-based HPA" in text.stdout
    assert "fluid lower bound" in text.stdout
    assert "hindsight reference" not in text.stdout.split("vs ref:")[0].split("\n", 3)[-1]


@pytest.mark.parametrize(("args", "says"), [
    (("--policies", "planner,nope"), "unknown nope"),
    (("--search-runs", "-1"), "--search-runs"),
])
def test_cli_refuses_bad_options_in_one_line(args: tuple[str, ...], says: str,
                                             tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n1,100,10\n")
    out = _simulate("--trace", str(trace), *args)
    assert out.returncode == 2
    assert says in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("content", [b"\x00\xff\xfe binary \x89PNG", b"", b"{not json\n"])
def test_cli_unreadable_traces_are_one_clear_line(content: bytes, tmp_path: Path) -> None:
    for name in ("t.csv", "t.jsonl"):
        trace = tmp_path / name
        trace.write_bytes(content)
        out = _simulate("--trace", str(trace))
        assert out.returncode == 2, (name, content, out.stdout)
        assert out.stderr.startswith("gpuscale:"), out.stderr
        assert "Traceback" not in out.stderr
    missing = _simulate("--trace", str(tmp_path / "absent.csv"))
    assert missing.returncode == 2
    assert "absent.csv" in missing.stderr


def test_the_reference_keeps_the_policies_floor() -> None:
    # Requests for five minutes, then five idle ones: a schedule free to reach 0 saves the
    # idle tail, which no policy held at one replica can; with the policies' floor of 1 the
    # reference keeps it too (the comparison's constraint, not a policy's waste).
    requests = [TraceRequest(float(t), 500, 50) for t in range(0, 300, 5)]
    starts = [run_policy("two", requests, 600.0, FAST, static=2)]
    free = hindsight_reference(requests, 600.0, FAST, starts, max_runs=200)
    held = hindsight_reference(requests, 600.0, FAST, starts, max_runs=200, floor=1)
    assert free.result.slo_violation_minutes == held.result.slo_violation_minutes == 0
    assert min(free.result.steps) == 0
    assert min(held.result.steps) == 1
    assert held.result.gpu_hours > free.result.gpu_hours
    # A start below the floor is not used: the floor holds even if it was the cheapest.
    low = run_policy("zero", requests, 600.0, FAST, schedule=free.result.steps)
    again = hindsight_reference(requests, 600.0, FAST, [low], max_runs=0, floor=1)
    assert min(again.result.steps) >= 1


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arrivals=st.lists(st.tuples(st.floats(0.0, 299.0), st.integers(10, 20_000),
                                   st.integers(1, 3_000)), min_size=1, max_size=60),
       static=st.integers(1, 4), floor=st.integers(0, 1),
       blocks=st.lists(st.integers(0, 4), min_size=6, max_size=6),
       slo=st.sampled_from(["ttft", "ttft-tpot"]))
def test_the_reference_is_never_beaten_by_its_starts_on_any_trace(
        arrivals: list[tuple[float, int, int]], static: int, floor: int,
        blocks: list[int], slo: str) -> None:
    """Whatever the trace, the objective and the starts (a static count, and an arbitrary
    schedule of minute blocks), the reference misses no more minutes than the best start,
    costs no more at as few, keeps the floor, and replays as reported."""
    spec = SLO_SPECS[slo]
    requests = sorted((TraceRequest(t, p, o) for t, p, o in arrivals),
                      key=lambda r: r.arrival_s)
    duration = 360.0
    schedule = [n for n in blocks for _ in range(60)]
    starts = [run_policy("static", requests, duration, FAST, static=static, slo=spec),
              run_policy("blocks", requests, duration, FAST, schedule=schedule, slo=spec)]
    ref = hindsight_reference(requests, duration, FAST, starts, max_runs=15, floor=floor,
                              slo=spec)
    for s in starts:
        if min(s.steps) >= floor:
            assert _key(ref.result) <= (s.slo_violation_minutes, s.gpu_hours + 1e-9)
    assert min(ref.result.steps) >= floor
    again = run_policy("again", requests, duration, FAST, schedule=ref.result.steps,
                       slo=spec)
    assert again.gpu_hours == pytest.approx(ref.result.gpu_hours)
    assert again.bad_minutes == ref.result.bad_minutes
