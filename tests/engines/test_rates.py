"""vLLM's counters -> per-pod rates (pure): hand-computed rates over a few scrapes, restarts,
missing and hostile counters, vLLM's own exposition, and properties over any sequence."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, enable_created_metrics, generate_latest
from prometheus_client import metrics as prom_metrics

from gpuscale.engines.signals import (
    SIGNAL_BOUNDS,
    VLLM_RATES,
    EngineSignals,
    VllmRates,
    engine_signals,
    samples,
    unavailable,
)
from gpuscale.scaler.core.profiles import PROFILES, SIGNALS, ProfileName
from gpuscale.telemetry.model import Absent

U, N = Absent.UNAVAILABLE, Absent.NO_DATA
PROMPT, GEN, DONE = "vllm-prompt-tps", "vllm-generation-tps", "vllm-finished-rate"
M = 'model_name="llama"'


def body(prompt: tuple[str, ...] = ("1000", "500"), gen: tuple[str, ...] = ("200", "100"),
         stop: tuple[str, ...] = ("5", "1"), length: str = "2") -> str:
    """Counters of two engines (data parallel in one pod); requests by finished_reason.
    An empty tuple leaves the metric out."""
    lines = ["# TYPE vllm:num_requests_running gauge",
             f'vllm:num_requests_running{{{M},engine="0"}} 3']
    for name, values in (("vllm:prompt_tokens_total", prompt),
                         ("vllm:generation_tokens_total", gen)):
        lines += [f'{name}{{{M},engine="{i}"}} {v}' for i, v in enumerate(values)]
    lines += [f'vllm:request_success_total{{{M},engine="{i}",finished_reason="stop"}} {v}'
              for i, v in enumerate(stop)]
    if stop:
        lines.append(f'vllm:request_success_total{{{M},engine="0",finished_reason="length"}} '
                     f"{length}")
    return "\n".join(lines) + "\n"


def rates(got: EngineSignals) -> tuple[object, object, object]:
    return got.signals[PROMPT], got.signals[GEN], got.signals[DONE]


def test_rates_over_the_latest_interval_summed_over_label_sets() -> None:
    r = VllmRates()
    first = engine_signals("vllm", body(), 10.0, vllm=r)
    assert rates(first) == (N, N, N)  # one scrape: nothing to difference
    assert first.signals["vllm-running"] == 3.0
    # +1000 prompt tokens, +100 generated, +6 finished (stop 9+3, length 2) in 2 s.
    second = engine_signals("vllm", body(("1600", "900"), ("260", "140"), ("9", "3")), 12.0,
                            vllm=r)
    assert rates(second) == (500.0, 50.0, 3.0)
    assert second.problems == ()
    # Only the last interval counts, not the scrapes before: +25 generated in 0.5 s.
    third = engine_signals("vllm", body(("1600", "900"), ("285", "140"), ("9", "3")), 12.5,
                           vllm=r)
    assert rates(third) == (0.0, 50.0, 0.0)


def test_a_counter_that_goes_back_starts_every_rate_over() -> None:
    """The engine restarted: its prompt counter is back near zero. Nothing is said about
    that scrape (the generation counter, higher than before, is not trusted either); the
    next interval is measured from the restart."""
    r = VllmRates()
    engine_signals("vllm", body(), 0.0, vllm=r)
    restarted = engine_signals("vllm", body(("10", "0"), ("300", "100"), ("0", "0"), "0"), 1.0,
                               vllm=r)
    assert rates(restarted) == (N, N, N)
    assert restarted.problems == ()
    after = engine_signals("vllm", body(("110", "0"), ("340", "100"), ("2", "0"), "0"), 3.0,
                           vllm=r)
    assert rates(after) == (50.0, 20.0, 1.0)


def test_a_missing_counter_is_no_data_for_its_rate_only() -> None:
    r = VllmRates()
    engine_signals("vllm", body(), 0.0, vllm=r)
    got = engine_signals("vllm", body(prompt=("1100", "500"), gen=()), 1.0, vllm=r)
    assert rates(got) == (100.0, N, 0.0)
    # Back again: its history was forgotten, so one more scrape before a rate.
    got = engine_signals("vllm", body(prompt=("1200", "500"), gen=("400", "0")), 2.0, vllm=r)
    assert rates(got) == (100.0, N, 0.0)
    got = engine_signals("vllm", body(prompt=("1200", "500"), gen=("410", "0")), 4.0, vllm=r)
    assert rates(got) == (0.0, 5.0, 0.0)


@pytest.mark.parametrize("second", [5.0, 4.0])
def test_no_time_between_scrapes_is_no_data(second: float) -> None:
    r = VllmRates()
    engine_signals("vllm", body(), 5.0, vllm=r)
    got = engine_signals("vllm", body(("2000", "500")), second, vllm=r)
    assert rates(got) == (N, N, N)
    assert got.problems == ()


def test_without_a_history_there_is_no_rate() -> None:
    assert rates(engine_signals("vllm", body(), 1.0)) == (N, N, N)


@pytest.mark.parametrize(("value", "why"), [
    ("-5", "vllm:prompt_tokens_total = -5 (negative)"),
    ("NaN", "vllm:prompt_tokens_total = NaN (not a number)"),
    ("+Inf", "vllm:prompt_tokens_total = +Inf (infinite, or too large)"),
    ("1e300", "vllm:prompt_tokens_total = 1e+300 (above 9.00719925474099e+15: float64 no "
              "longer counts in ones)"),
    (str(2 ** 53), "vllm:prompt_tokens_total sums to 9.0072e+15 over 2 series (above "
                   "9.00719925474099e+15"),
])
def test_a_hostile_counter_blanks_its_rate_and_says_why(value: str, why: str) -> None:
    """The other engine's series (500) is not used alone; the other rates and the gauges
    stay; the bad counter's history is forgotten, so the next good scrape has no rate."""
    r = VllmRates()
    engine_signals("vllm", body(), 0.0, vllm=r)
    got = engine_signals("vllm", body(prompt=(value, "500"), gen=("300", "100")), 1.0, vllm=r)
    assert rates(got) == (U, 100.0, 0.0)
    assert got.signals["vllm-running"] == 3.0
    assert len(got.problems) == 1
    assert got.problems[0].startswith(why), got.problems
    got = engine_signals("vllm", body(prompt=("1500", "500"), gen=("300", "100")), 2.0,
                         vllm=r)
    assert rates(got) == (N, 0.0, 0.0)


@pytest.mark.parametrize(("prompt", "stop", "dt", "bad", "why"), [
    ("20001000", "5", 1.0, PROMPT, "vllm:prompt_tokens_total rose by 2e+07 in 1 s: 2e+07 "
                                   "tokens/s (above 10000000 tokens/s: not plausible"),
    ("1000", "200007", 2.0, DONE, "vllm:request_success_total rose by 200002 in 2 s: "
                                  "100001 requests/s (above 100000 requests/s"),
    ("1001", "5", 1e-320, PROMPT, "vllm:prompt_tokens_total rose by 1 in 9.99989e-321 s: inf "
                                  "tokens/s (above 10000000"),
])
def test_an_implausible_rate_is_unavailable_with_the_reason(
        prompt: str, stop: str, dt: float, bad: str, why: str) -> None:
    r = VllmRates()
    engine_signals("vllm", body(), 0.0, vllm=r)
    got = engine_signals("vllm", body((prompt, "500"), stop=(stop, "1")), dt, vllm=r)
    assert got.problems[0].startswith(why), got.problems
    assert got.signals[bad] == U
    assert len(got.problems) == 1


def test_a_rate_at_its_bound_is_a_number() -> None:
    r = VllmRates()
    engine_signals("vllm", body(stop=("0", "0"), length="0"), 0.0, vllm=r)
    got = engine_signals("vllm", body(stop=("100000", "0"), length="0"), 1.0, vllm=r)
    assert got.signals[DONE] == 100_000.0
    assert got.problems == ()


@pytest.fixture
def created_series() -> Iterator[None]:
    """prometheus_client writes ``*_created`` series unless a process turned them off (the
    agent does, process-wide, when an earlier test built one): on for this test only."""
    was = prom_metrics._use_created
    enable_created_metrics()
    yield
    prom_metrics._use_created = was


@pytest.mark.usefixtures("created_series")
def test_vllm_exposition_as_prometheus_client_writes_it() -> None:
    """vLLM registers ``vllm:prompt_tokens`` etc. with prometheus_client, which writes the
    samples as ``..._total`` next to ``..._created`` timestamps (not counted)."""
    def exposition(prompt: float, generated: float, finished: dict[str, float]) -> str:
        registry = CollectorRegistry()
        labels = ["model_name", "engine"]
        p = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", labels,
                    registry=registry)
        g = Counter("vllm:generation_tokens", "Number of generation tokens processed.",
                    labels, registry=registry)
        s = Counter("vllm:request_success", "Count of successfully processed requests.",
                    [*labels, "finished_reason"], registry=registry)
        p.labels("llama", "0").inc(prompt)
        g.labels("llama", "0").inc(generated)
        for reason in ("stop", "length", "abort"):
            s.labels("llama", "0", reason).inc(finished.get(reason, 0.0))
        return generate_latest(registry).decode()

    first = exposition(100, 40, {"stop": 2})
    assert "vllm:prompt_tokens_created" in first
    assert samples(first)["vllm:request_success_total"] == [2.0, 0.0, 0.0]
    r = VllmRates()
    engine_signals("vllm", first, 0.0, vllm=r)
    got = engine_signals("vllm", exposition(400, 100, {"stop": 5, "length": 1}), 3.0, vllm=r)
    assert rates(got) == (100.0, 20.0, 4.0 / 3.0)


def test_the_rates_are_registered_everywhere_and_not_in_the_vllm_profile() -> None:
    names = {r.signal for r in VLLM_RATES}
    assert names == {PROMPT, GEN, DONE}
    assert names <= set(unavailable("vllm"))
    assert {SIGNALS[n].unit for n in names} == {"tokens/s", "requests/s"}
    for name, bound in SIGNAL_BOUNDS.items():  # an agent's number is never refused
        assert SIGNALS[name].limit >= bound, name
    vllm = PROFILES[ProfileName.VLLM_INFERENCE]
    assert not names & {t.signal for t in vllm.targets}


def sound(got: EngineSignals) -> None:
    for name in (PROMPT, GEN, DONE):
        value = got.signals[name]
        assert isinstance(value, Absent) or (
            math.isfinite(value) and 0.0 <= value <= SIGNAL_BOUNDS[name]), (name, value)
    if U in got.signals.values():
        assert got.problems


COUNTS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=0, max_value=2.0 ** 53),
    st.integers(min_value=-(10 ** 20), max_value=10 ** 20).map(float))
TIMES = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                  st.floats(min_value=0, max_value=1e6))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(TIMES, COUNTS, COUNTS, st.booleans()), max_size=12))
def test_any_sequence_of_counters_gives_no_negative_or_non_finite_rate(
        scrapes: list[tuple[float, float, float, bool]]) -> None:
    """Times in any order (equal, backward, huge, not finite), counters going anywhere,
    present or not: every rate is Absent or a finite number within its bound."""
    r = VllmRates()
    for at, prompt, finished, with_gen in scrapes:
        values = {"vllm:prompt_tokens_total": [prompt],
                  "vllm:request_success_total": [finished, 1.0]}
        if with_gen:
            values["vllm:generation_tokens_total"] = [abs(prompt)]
        sound(r.signals(values, at))


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=0, max_value=1e5),
       st.lists(st.tuples(st.floats(min_value=2e-3, max_value=100.0),
                          st.floats(min_value=0, max_value=1e4)), min_size=1, max_size=10))
def test_growing_counters_give_the_increase_over_the_last_interval(
        start: float, steps: list[tuple[float, float]]) -> None:
    """Counters that only grow, at times that only advance: each rate after the first scrape
    is exactly (increase) / (time between the last two scrapes) (up to 1e7 tokens/s, the
    bound)."""
    r = VllmRates()
    t, n = 0.0, start
    r.signals({"vllm:generation_tokens_total": [n]}, t)
    for dt, more in steps:
        t1, n1 = t + dt, n + more
        got = r.signals({"vllm:generation_tokens_total": [n1]}, t1)
        assert got.signals[GEN] == (n1 - n) / (t1 - t)
        assert got.signals[PROMPT] == N  # absent from every body
        t, n = t1, n1
