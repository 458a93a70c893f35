"""Engine /metrics text -> signals (pure): captured-format bodies, hostile values, and a
property over any text."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscale.engines.signals import (
    ENGINES,
    SIGNAL_BOUNDS,
    EngineParseError,
    EngineSignals,
    TritonWindow,
    VllmRates,
    engine_signals,
    samples,
)
from gpuscale.telemetry.model import Absent

DATA = Path(__file__).parent / "data"
U, N = Absent.UNAVAILABLE, Absent.NO_DATA
NO_RATES = {"vllm-prompt-tps": N, "vllm-generation-tps": N, "vllm-finished-rate": N}


def triton_text(a: tuple[float, float], b: tuple[float, float], pending: str = "7") -> str:
    text = (DATA / "triton_metrics.txt").read_text()
    for name, value in (("SUCCESS_A", a[0]), ("QUEUE_A", a[1]), ("SUCCESS_B", b[0]),
                        ("QUEUE_B", b[1])):
        text = text.replace(name, repr(value))
    return text.replace('model="resnet",version="1"} 7', f'model="resnet",version="1"}} '
                                                         f'{pending}')


def test_vllm_signals_sum_over_engines() -> None:
    got = engine_signals("vllm", (DATA / "vllm_metrics.txt").read_text(), 0.0)
    assert got.signals == {"vllm-waiting": 7.0, "vllm-running": 21.0, "vllm-requests": 28.0,
                           "vllm-kv-cache": pytest.approx(57.0), **NO_RATES}
    assert got.problems == ()


def test_vllm_old_kv_cache_name_falls_back() -> None:
    got = engine_signals("vllm", (DATA / "vllm_old_metrics.txt").read_text(), 0.0)
    assert got.signals == {"vllm-waiting": 0.0, "vllm-running": 4.0, "vllm-requests": 4.0,
                           "vllm-kv-cache": 25.0, **NO_RATES}


def test_missing_metrics_are_no_data_never_zero() -> None:
    got = engine_signals("vllm", "# TYPE other gauge\nother 1\n", 0.0)
    assert set(got.signals.values()) == {N}
    assert engine_signals("tgi", "", 0.0) == EngineSignals({"tgi-queue": N, "tgi-batch": N})


def test_tgi() -> None:
    assert engine_signals("tgi", (DATA / "tgi_metrics.txt").read_text(), 0.0).signals == {
        "tgi-queue": 6.0, "tgi-batch": 14.0}


def test_triton_queue_time_is_a_windowed_rate_of_counters() -> None:
    w = TritonWindow(window_s=30.0)
    first = w.signals(samples(triton_text((100, 5e5), (50, 2.5e5))), 0.0).signals
    assert first == {"triton-pending": 9.0, "triton-queue-time": N}
    # 60 more requests waited 1.8 s in total: 30 ms each.
    second = w.signals(samples(triton_text((140, 5e5 + 1.2e6), (70, 2.5e5 + 0.6e6))), 10.0)
    assert second.signals["triton-queue-time"] == pytest.approx(30.0)
    # Nothing completed in the last window: nobody waited.
    later = w.signals(samples(triton_text((140, 1.7e6), (70, 0.85e6))), 50.0)
    assert later.signals["triton-queue-time"] == N  # the window holds one scrape
    quiet = w.signals(samples(triton_text((140, 1.7e6), (70, 0.85e6))), 55.0)
    assert quiet.signals["triton-queue-time"] == 0.0
    # A restarted server (counters back to small numbers) starts a new window.
    restarted = w.signals(samples(triton_text((1, 10), (1, 10))), 60.0)
    assert restarted.signals["triton-queue-time"] == N


@pytest.mark.parametrize(("text", "where"), [
    ("{{{", "line 1: "),
    ('# TYPE x gauge\nx 1\nmetric{a="b" 1\n', "line 3: "),
    ("x 1\nx{\n", "line 2: "),
    ("# TYPE x gauge\nx notanumber\n", "line 2: "),
    ("# TYPE x\n", "line 1: "),
    ("x 1 " + "9" * 400 + "\n", "line 1: "),  # a timestamp beyond float range
])
def test_garbage_is_a_parse_error_naming_the_line(text: str, where: str) -> None:
    with pytest.raises(EngineParseError, match=f"^{where}not Prometheus text format"):
        engine_signals("vllm", text, 0.0)


def vllm_body(waiting: str = "3", running: str = "4", kv: str = "0.5") -> str:
    return (f'vllm:num_requests_waiting{{engine="0"}} {waiting}\n'
            f'vllm:num_requests_waiting{{engine="1"}} 50\n'
            f"vllm:num_requests_running {running}\nvllm:kv_cache_usage_perc {kv}\n")


@pytest.mark.parametrize(("waiting", "why"), [
    ("-43", "vllm:num_requests_waiting = -43 (negative)"),
    ("NaN", "vllm:num_requests_waiting = NaN (not a number)"),
    ("+Inf", "vllm:num_requests_waiting = +Inf (infinite, or too large)"),
    ("-Inf", "vllm:num_requests_waiting = -Inf (infinite, or too large)"),
    ("1e300", "vllm:num_requests_waiting = 1e+300 (above 1000000: not plausible"),
    ("123456789012345678901234567890", "= 1.23457e+29 (above 1000000"),
    ("9" * 400, "vllm:num_requests_waiting = +Inf (infinite, or too large)"),
    ("999999", "vllm:num_requests_waiting sums to 1.00005e+06 over 2 series (above 1000000"),
])
def test_a_hostile_value_blanks_its_signals_and_says_why(waiting: str, why: str) -> None:
    """The other label set (50) is not summed alone, and the sum with running is not made;
    running and the KV cache do not use the bad metric and stay."""
    got = engine_signals("vllm", vllm_body(waiting=waiting), 0.0)
    assert got.signals == {"vllm-waiting": U, "vllm-running": 4.0, "vllm-requests": U,
                           "vllm-kv-cache": 50.0, **NO_RATES}
    assert len(got.problems) == 1
    assert why in got.problems[0]


def test_every_bad_metric_is_named_and_a_fraction_above_one_is_refused() -> None:
    got = engine_signals("vllm", vllm_body(running="-1", kv="1.5"), 0.0)
    assert got.signals == {"vllm-waiting": 53.0, "vllm-running": U, "vllm-requests": U,
                           "vllm-kv-cache": U, **NO_RATES}
    assert sorted(got.problems) == ["vllm:kv_cache_usage_perc = 1.5 (above 1: a fraction)",
                                    "vllm:num_requests_running = -1 (negative)"]


def test_tgi_hostile_queue_keeps_the_batch() -> None:
    got = engine_signals("tgi", "tgi_queue_size -2\ntgi_batch_current_size 14\n", 0.0)
    assert got == EngineSignals({"tgi-queue": U, "tgi-batch": 14.0},
                                ("tgi_queue_size = -2 (negative)",))


def test_triton_hostile_values() -> None:
    w = TritonWindow()
    got = w.signals(samples(triton_text((100, 5e5), (50, 2.5e5), pending="NaN")), 0.0)
    assert got.signals == {"triton-pending": U, "triton-queue-time": N}
    assert got.problems == ("nv_inference_pending_request_count = NaN (not a number)",)
    # A counter beyond 2**53 cannot be differenced; pending does not use it and stays.
    got = w.signals(samples(triton_text((100, 1e300), (50, 2.5e5))), 1.0)
    assert got.signals == {"triton-pending": 9.0, "triton-queue-time": U}
    assert "nv_inference_queue_duration_us_total = 1e+300 (above 9.00719925474099e+15" \
        in got.problems[0]
    got = w.signals(samples(triton_text((-5, 5e5), (50, 2.5e5))), 2.0)
    assert got.signals["triton-queue-time"] == U
    assert got.problems == ("nv_inference_request_success_total = -5 (negative)",)
    # Sound counters whose mean is absurd: one request that waited two hours.
    w = TritonWindow()
    w.signals(samples(triton_text((100, 0), (0, 0))), 0.0)
    got = w.signals(samples(triton_text((101, 7.2e9), (0, 0))), 10.0)
    assert got.signals["triton-queue-time"] == U
    assert "mean queue time over the window is 7.2e+06 ms (above 3600000 ms" in got.problems[0]


# Exposition-like text with the metrics the signals read, hostile values and junk lines, so
# that most examples reach the checks (random text alone rarely parses).
NAMES = ["vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
         "vllm:gpu_cache_usage_perc", "nv_inference_pending_request_count",
         "nv_inference_queue_duration_us", "nv_inference_request_success", "tgi_queue_size",
         "tgi_batch_current_size", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
         "vllm:request_success_total", "other_metric"]
VALUES = st.one_of(
    st.sampled_from(["-43", "NaN", "+Inf", "-Inf", "1e300", "-0", "0", "1", "0.5", "1e-300",
                     "123456789012345678901234567890", "9" * 400, "0x10", "1_0", "", "1 2",
                     f"1 {'9' * 400}"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(10 ** 40), max_value=10 ** 40).map(str))
LABELS = st.sampled_from(["", '{engine="0"}', '{engine="1",model_name="m"}', "{", '{a="b"',
                          '{engine="\\"}'])
LINE = st.one_of(
    st.tuples(st.sampled_from(NAMES), LABELS, VALUES).map(lambda t: f"{t[0]}{t[1]} {t[2]}"),
    st.tuples(st.sampled_from(["TYPE", "HELP"]), st.sampled_from(NAMES),
              st.sampled_from(["gauge", "counter", "histogram", ""])).map(
        lambda t: f"# {t[0]} {t[1]} {t[2]}"),
    st.text(max_size=30))
BODY = st.lists(LINE, max_size=12).map("\n".join)


def assert_sound(engine: str, got: EngineSignals) -> None:
    for name, value in got.signals.items():
        assert isinstance(value, Absent) or (
            math.isfinite(value) and 0.0 <= value <= SIGNAL_BOUNDS[name]), (engine, name,
                                                                             value)
    if U in got.signals.values():
        assert got.problems, "an UNAVAILABLE signal without a reason"


def signals_or_parse_error(engine: str, text: str, at: float, window: TritonWindow,
                           rates: VllmRates) -> None:
    try:
        got = engine_signals(engine, text, at, window, rates)
    except EngineParseError as exc:
        why = str(exc)
    else:
        assert_sound(engine, got)
        return
    assert why.startswith("line "), why


@settings(max_examples=400, deadline=None)
@given(st.one_of(BODY, st.text(max_size=300)), st.one_of(BODY, st.text(max_size=300)))
def test_any_text_gives_sound_signals_or_a_parse_error(first: str, second: str) -> None:
    """Whatever the engine sends, the parser raises nothing but EngineParseError and no
    signal is negative, non-finite or above its bound (two bodies in a row, so Triton's
    windowed mean and vLLM's rates are computed too)."""
    for engine in ENGINES:
        window, rates = TritonWindow(), VllmRates()
        for at, text in ((0.0, first), (10.0, second)):
            signals_or_parse_error(engine, text, at, window, rates)

