"""A vLLM /metrics body of realistic size and shape, for the simulated engines and the
benchmarks: the families vLLM's
v1 ``PrometheusStatLogger`` (vllm/v1/metrics/loggers.py) registers for one model, with
their bucket lists, plus what a vLLM process exposes beside them (prometheus_client's
process and GC collectors, the API server's HTTP instrumentation per handler). Rendered
by prometheus_client itself, ``_created`` series included, so the text is what a real
engine sends; about 60 KiB, in the 50-200 KiB range real engines answer with."""

from __future__ import annotations

from functools import cache

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    ProcessCollector,
    generate_latest,
)


def _one_two_five(limit: int) -> list[float]:
    out: list[int] = []
    exp = 0
    while True:
        for m in (1, 2, 5):
            v = m * 10 ** exp
            if v > limit:
                return [float(x) for x in out]
            out.append(v)
        exp += 1


def vllm_body(model: str = "meta-llama/Llama-3.1-8B-Instruct", running: int = 30,
              waiting: int = 2, read: bool = True) -> str:
    """The body; ``read=False`` leaves out the families gpuscale's signals read (to append
    to a simulated engine's body, which has those)."""
    reg = CollectorRegistry()
    ProcessCollector(registry=reg)
    GCCollector(registry=reg)
    lab = {"model_name": model, "engine": "0"}
    names = ["model_name", "engine"]
    if read:
        for name, value in (("num_requests_running", running),
                            ("num_requests_waiting", waiting), ("kv_cache_usage_perc", 0.42)):
            Gauge(f"vllm:{name}", name, names, registry=reg).labels(**lab).set(value)
        for c in ("prompt_tokens", "generation_tokens"):
            Counter(f"vllm:{c}", c, names, registry=reg).labels(**lab).inc(123456)
        ok = Counter("vllm:request_success", "done", [*names, "finished_reason"],
                     registry=reg)
        for why in ("stop", "length", "abort"):
            ok.labels(**lab, finished_reason=why).inc(1000)
    for c in ("prefix_cache_queries", "prefix_cache_hits", "num_preemptions"):
        Counter(f"vllm:{c}", c, names, registry=reg).labels(**lab).inc(123456)
    tok: list[float] = _one_two_five(8192)
    secs = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
            5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
    histograms: list[tuple[str, list[float]]] = [
            ("iteration_tokens_total", [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096,
                                        8192, 16384]),
            ("request_prompt_tokens", tok), ("request_generation_tokens", tok),
            ("request_max_num_generation_tokens", tok), ("request_params_n", [1, 2, 5, 10, 20]),
            ("request_params_max_tokens", tok), ("time_to_first_token_seconds", secs),
            ("time_per_output_token_seconds", secs[:18]),
            ("inter_token_latency_seconds", secs[:18]),
            ("e2e_request_latency_seconds", secs[3:]), ("request_queue_time_seconds", secs[3:]),
            ("request_inference_time_seconds", secs[3:]),
            ("request_prefill_time_seconds", secs[3:]),
            ("request_decode_time_seconds", secs[3:])]
    for name, buckets in histograms:
        h = Histogram(f"vllm:{name}", name, names, buckets=buckets, registry=reg)
        h.labels(**lab).observe(0.3)
    Gauge("vllm:cache_config_info", "cache config",
          ["block_size", "cache_dtype", "gpu_memory_utilization", "num_gpu_blocks"],
          registry=reg).labels("16", "auto", "0.9", "27000").set(1)
    handlers = ["/v1/completions", "/v1/chat/completions", "/metrics", "/health",
                "/v1/models", "/tokenize"]
    reqs = Counter("http_requests_total", "reqs", ["method", "status", "handler"], registry=reg)
    size = Histogram("http_request_size_bytes", "size", ["handler"], registry=reg)
    rsize = Histogram("http_response_size_bytes", "size", ["handler"], registry=reg)
    dur = Histogram("http_request_duration_seconds", "latency", ["method", "handler"],
                    registry=reg)
    highr = Histogram("http_request_duration_highr_seconds", "latency",
                      buckets=[0.01 * i for i in range(1, 60)] + [1, 2, 5, 10, 30, 60],
                      registry=reg)
    for hd in handlers:
        for status in ("2xx", "4xx", "5xx"):
            reqs.labels("GET" if hd in ("/metrics", "/health", "/v1/models") else "POST",
                        status, hd).inc(7)
        size.labels(hd).observe(100)
        rsize.labels(hd).observe(1000)
        dur.labels("POST", hd).observe(0.2)
    highr.observe(0.2)
    return generate_latest(reg).decode()


@cache
def unread_families() -> str:
    """What a real vLLM sends beside the families gpuscale reads (made once): appended
    to each simulated vLLM's body, so the agents scrape real-size bodies."""
    return vllm_body(read=False)
