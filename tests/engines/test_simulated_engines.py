"""The demo's simulated vLLM engine: its counters follow its load, read by the real
signal code."""

from __future__ import annotations

from gpuscale.attribution.model import PodInfo
from gpuscale.engines.signals import VllmRates, engine_signals, samples
from gpuscale.engines.simulated_engines import SimulatedEngine, vllm_metrics
from gpuscale.telemetry.load import Constant, Sine
from gpuscale.telemetry.model import Absent

POD = PodInfo("llm", "vllm-llama-0", "uid-0", ip="127.0.0.1")
COUNTERS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total",
            "vllm:request_success_total")


def test_rates_follow_the_running_requests() -> None:
    """At 50 % load 32 requests run, each generating 30 tokens/s (960 tokens/s); one in 256
    generated tokens ends a request (3.75/s), each of which read 512 prompt tokens (1920
    tokens/s). Whole counts: 11 finished by t=3 (10 stop, 1 length), 3 by t=1."""
    engine = SimulatedEngine(POD, "vllm", Constant(50.0))
    rates = VllmRates()
    got = [engine_signals("vllm", engine.render(t), t, vllm=rates).signals
           for t in (0.0, 1.0, 3.0)]
    assert got[0]["vllm-generation-tps"] is Absent.NO_DATA
    assert got[1]["vllm-running"] == 32.0
    assert (got[1]["vllm-prompt-tps"], got[1]["vllm-generation-tps"],
            got[1]["vllm-finished-rate"]) == (1920.0, 960.0, 3.0)
    assert (got[2]["vllm-prompt-tps"], got[2]["vllm-generation-tps"],
            got[2]["vllm-finished-rate"]) == (1920.0, 960.0, 4.0)


def test_counters_only_grow_and_rates_track_the_load() -> None:
    engine = SimulatedEngine(POD, "vllm", Sine(50.0, 50.0, 60.0))
    rates = VllmRates()
    before = dict.fromkeys(COUNTERS, 0.0)
    for i in range(240):
        t = i * 0.5
        text = engine.render(t)
        now = {name: sum(samples(text)[name]) for name in COUNTERS}
        assert all(now[n] >= before[n] for n in COUNTERS), (t, before, now)
        before = now
        got = engine_signals("vllm", text, t, vllm=rates)
        assert got.problems == ()
        if i:
            running = got.signals["vllm-running"]
            assert not isinstance(running, Absent)
            assert got.signals["vllm-generation-tps"] == running * 30.0, t
    assert before["vllm:request_success_total"] > 0


def test_without_counters_the_text_has_none() -> None:
    """The live demo's serving model passes no counters (its clock is scaled): no rates."""
    text = vllm_metrics("m", 3, 1, 0.5)
    assert not set(samples(text)) & set(COUNTERS)


def test_a_simulated_vllm_answers_with_a_real_engines_size() -> None:
    """Beside the families gpuscale reads, a simulated vLLM sends what a real one does
    (histograms, process and HTTP metrics: tens of KiB), so an agent scraping the demo
    pays what it pays on a node; the signals read the same."""
    text = SimulatedEngine(POD, "vllm", Constant(50.0)).render(1.0)
    assert len(text.encode()) > 40_000
    names = set(samples(text))
    assert {"vllm:time_to_first_token_seconds_bucket", "process_cpu_seconds_total",
            "http_requests_total"} <= names
    got = engine_signals("vllm", text, 1.0, vllm=VllmRates())
    assert got.problems == ()
    assert got.signals["vllm-running"] == 32.0
