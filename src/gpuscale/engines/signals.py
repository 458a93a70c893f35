"""Inference-engine /metrics text -> per-pod engine signals (pure; no I/O).

Parsed with prometheus_client's text parser. Each engine's signals, per pod:

- vLLM: ``vllm-waiting`` / ``vllm-running`` = sum of ``vllm:num_requests_waiting`` /
  ``vllm:num_requests_running`` over all label sets (``model_name``, ``engine``), and
  ``vllm-requests`` their sum;
  ``vllm-kv-cache`` = 100 x the largest ``vllm:kv_cache_usage_perc`` (0-1), falling back to
  the older ``vllm:gpu_cache_usage_perc``.
- Triton: ``triton-pending`` = sum of ``nv_inference_pending_request_count``;
  ``triton-queue-time`` (ms) = increase of ``nv_inference_queue_duration_us`` over increase
  of ``nv_inference_request_success`` within the last window, both summed over models, with
  the scrape times (not the asker's) as the clock. No request in the window -> 0 ms (nobody
  waited); fewer than two scrapes in the window -> no data.
- TGI: ``tgi-queue`` = ``tgi_queue_size``, ``tgi-batch`` = ``tgi_batch_current_size``.

A metric the engine does not expose is ``Absent.NO_DATA`` for that signal, never 0.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from gpuscale.common.errors import PeerError
from gpuscale.telemetry.model import Absent, Reading

ENGINES = ("vllm", "triton", "tgi")
TRITON_WINDOW_S = 30.0
MAX_SERIES = 20_000  # bounded work per body, whatever the engine emits


class EngineParseError(PeerError, ValueError):
    """A body that is not Prometheus text exposition (the message says where)."""


def samples(text: str) -> dict[str, list[float]]:
    """Metric name -> the values of its samples (counters keep their ``_total`` name).
    Raises EngineParseError for text that is not exposition format."""
    out: dict[str, list[float]] = {}
    count = 0
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                count += 1
                if count > MAX_SERIES:
                    raise EngineParseError(f"more than {MAX_SERIES} samples")
                if math.isfinite(s.value):
                    out.setdefault(s.name, []).append(float(s.value))
    except EngineParseError:
        raise
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        raise EngineParseError(f"not Prometheus text format: {str(exc)[:120]}") from None
    return out


def _sum(values: Mapping[str, list[float]], *names: str) -> Reading:
    for name in names:
        if name in values:
            return sum(values[name])
    return Absent.NO_DATA


def _max(values: Mapping[str, list[float]], *names: str) -> Reading:
    for name in names:
        if values.get(name):
            return max(values[name])
    return Absent.NO_DATA


def vllm_signals(values: Mapping[str, list[float]]) -> dict[str, Reading]:
    kv = _max(values, "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    waiting = _sum(values, "vllm:num_requests_waiting")
    running = _sum(values, "vllm:num_requests_running")
    requests: Reading = (waiting if isinstance(waiting, Absent) else
                         running if isinstance(running, Absent) else waiting + running)
    return {
        "vllm-waiting": waiting,
        "vllm-running": running,
        "vllm-requests": requests,
        "vllm-kv-cache": kv if isinstance(kv, Absent) else 100.0 * kv,
    }


def tgi_signals(values: Mapping[str, list[float]]) -> dict[str, Reading]:
    return {"tgi-queue": _sum(values, "tgi_queue_size"),
            "tgi-batch": _sum(values, "tgi_batch_current_size")}


@dataclass
class TritonWindow:
    """Counter history of one pod, to turn Triton's counters into a windowed mean."""

    window_s: float = TRITON_WINDOW_S
    history: deque[tuple[float, float, float]] = field(default_factory=deque)  # t, us, n

    def signals(self, values: Mapping[str, list[float]], scraped_at: float,
                ) -> dict[str, Reading]:
        pending = _sum(values, "nv_inference_pending_request_count")
        queue_us = _sum(values, "nv_inference_queue_duration_us_total",
                        "nv_inference_queue_duration_us")
        success = _sum(values, "nv_inference_request_success_total",
                       "nv_inference_request_success")
        queue_ms: Reading = Absent.NO_DATA
        if not isinstance(queue_us, Absent) and not isinstance(success, Absent):
            if self.history and (queue_us < self.history[-1][1] or
                                 success < self.history[-1][2]):
                self.history.clear()  # counters went back: the server restarted
            self.history.append((scraped_at, queue_us, success))
            while self.history and self.history[0][0] < scraped_at - self.window_s:
                self.history.popleft()
            if len(self.history) >= 2:
                _, us0, n0 = self.history[0]
                done = success - n0
                queue_ms = (queue_us - us0) / done / 1000.0 if done > 0 else 0.0
        return {"triton-pending": pending, "triton-queue-time": queue_ms}


def engine_signals(engine: str, text: str, scraped_at: float,
                   triton: TritonWindow | None = None) -> dict[str, Reading]:
    """Signals of one scrape. Raises EngineParseError; ValueError for an unknown engine."""
    values = samples(text)
    if engine == "vllm":
        return vllm_signals(values)
    if engine == "tgi":
        return tgi_signals(values)
    if engine == "triton":
        return (triton or TritonWindow()).signals(values, scraped_at)
    raise ValueError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")


def unavailable(engine: str) -> dict[str, Reading]:
    """Every signal of ``engine`` marked unavailable (the scrape failed)."""
    names: Iterable[str] = {"vllm": ("vllm-waiting", "vllm-running", "vllm-requests",
                                     "vllm-kv-cache"),
                            "triton": ("triton-pending", "triton-queue-time"),
                            "tgi": ("tgi-queue", "tgi-batch")}.get(engine, ())
    return dict.fromkeys(names, Absent.UNAVAILABLE)
