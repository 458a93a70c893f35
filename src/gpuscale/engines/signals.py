"""Inference-engine /metrics text -> per-pod engine signals (pure; no I/O).

Parsed with prometheus_client's text parser. Each engine's signals, per pod:

- vLLM: ``vllm-waiting`` / ``vllm-running`` = sum of ``vllm:num_requests_waiting`` /
  ``vllm:num_requests_running`` over all label sets (``model_name``, ``engine``), and
  ``vllm-requests`` their sum;
  ``vllm-kv-cache`` = 100 x the largest ``vllm:kv_cache_usage_perc`` (0-1), falling back to
  the older ``vllm:gpu_cache_usage_perc``;
  ``vllm-prompt-tps`` / ``vllm-generation-tps`` (tokens/s) and ``vllm-finished-rate``
  (requests/s) = the per-second increase of ``vllm:prompt_tokens_total`` /
  ``vllm:generation_tokens_total`` / ``vllm:request_success_total`` (each summed over all
  label sets: ``model_name``, ``engine``, and ``finished_reason`` for the last) between
  the pod's last two scrapes, divided by the difference of the scrape times (not the
  asker's clock). The latest interval, not a longer window, because the planner wants
  the rate at the scrape cadence (1 s); a scrape that failed in between makes that one
  rate the mean over the gap. Fewer than two scrapes with the counter, a zero (or
  backward) time difference, or a counter lower than before (the engine restarted: every
  rate's history starts over) -> no data for that scrape. A counter missing from the body
  (or unusable) is no data for its signal only, and its history is forgotten. A rate
  above ``MAX_TOKENS_PER_S`` / ``MAX_FINISHED_PER_S`` is UNAVAILABLE, with the reason.
  Names as vLLM declares them in ``vllm/v1/metrics/loggers.py`` (``PrometheusStatLogger``,
  github.com/vllm-project/vllm at 005a810bc40faa25b8870fbc8559c3462581eee3:
  ``vllm:prompt_tokens``, ``vllm:generation_tokens``, ``vllm:request_success`` with
  ``labelnames + ["finished_reason"]``), which prometheus_client exposes with ``_total``.
- Triton: ``triton-pending`` = sum of ``nv_inference_pending_request_count``;
  ``triton-queue-time`` (ms) = increase of ``nv_inference_queue_duration_us`` over increase
  of ``nv_inference_request_success`` within the last window, both summed over models, with
  the scrape times (not the asker's) as the clock. No request in the window -> 0 ms (nobody
  waited); fewer than two scrapes in the window -> no data.
- TGI: ``tgi-queue`` = ``tgi_queue_size``, ``tgi-batch`` = ``tgi_batch_current_size``.

A metric the engine does not expose is ``Absent.NO_DATA`` for that signal, never 0.

Every sample a signal is made of is checked before it counts, because the workload's sum
must never shrink (or overflow) on one engine's nonsense: a value that is not finite, is
negative, or is above its metric's plausible bound (``BOUNDS``: requests in one engine
pod up to 1,000,000; cache use a fraction up to 1; counters up to 2**53, where float64
still counts in ones), and a sum over label sets above that bound, make the signal
``Absent.UNAVAILABLE`` - the whole signal, never a sum of the other label sets - and
``EngineSignals.problems`` names the metric and the value. Signals that do not use that
metric keep their numbers (``vllm-requests`` uses both waiting and running). Whatever the
text, a signal is Absent or a finite number between 0 and its bound
(``SIGNAL_BOUNDS``).
"""

from __future__ import annotations

import io
import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TextIO, cast

from prometheus_client.parser import text_fd_to_metric_families

from gpuscale.common.errors import PeerError
from gpuscale.engines.line_filter import related, select_lines
from gpuscale.telemetry.model import Absent, Reading

ENGINES = ("vllm", "triton", "tgi")
TRITON_WINDOW_S = 30.0
MAX_SERIES = 20_000  # bounded work per body, whatever the engine emits


class EngineParseError(PeerError, ValueError):
    """A body that is not Prometheus text exposition (the message says where)."""


@dataclass(frozen=True, slots=True)
class Bound:
    """The largest plausible value of one metric, and why (for the message)."""

    limit: float
    why: str


REQUESTS = Bound(1_000_000, "not plausible for one engine pod")
FRACTION = Bound(1.0, "a fraction")
COUNTER = Bound(2.0 ** 53, "float64 no longer counts in ones")
MAX_QUEUE_MS = 3_600_000.0  # a mean wait over an hour: no client waits that long
# Per pod: a node of eight H100s prefills ~1e5-1e6 tokens/s; 100x that is a broken peer.
MAX_TOKENS_PER_S = 10_000_000.0
MAX_FINISHED_PER_S = 100_000.0  # requests finished per second in one engine pod


@dataclass(frozen=True, slots=True)
class Rate:
    """A rate signal made of one counter, and its plausible bound (per second)."""

    signal: str
    counter: str
    limit: float
    unit: str


VLLM_RATES = (
    Rate("vllm-prompt-tps", "vllm:prompt_tokens_total", MAX_TOKENS_PER_S, "tokens/s"),
    Rate("vllm-generation-tps", "vllm:generation_tokens_total", MAX_TOKENS_PER_S,
         "tokens/s"),
    Rate("vllm-finished-rate", "vllm:request_success_total", MAX_FINISHED_PER_S,
         "requests/s"),
)

#: Plausible range of every metric a signal is made of: [0, limit].
BOUNDS: Mapping[str, Bound] = {
    "vllm:num_requests_waiting": REQUESTS,
    "vllm:num_requests_running": REQUESTS,
    "vllm:kv_cache_usage_perc": FRACTION,
    "vllm:gpu_cache_usage_perc": FRACTION,
    "vllm:prompt_tokens_total": COUNTER,
    "vllm:generation_tokens_total": COUNTER,
    "vllm:request_success_total": COUNTER,
    "nv_inference_pending_request_count": REQUESTS,
    "nv_inference_queue_duration_us_total": COUNTER,
    "nv_inference_queue_duration_us": COUNTER,
    "nv_inference_request_success_total": COUNTER,
    "nv_inference_request_success": COUNTER,
    "tgi_queue_size": REQUESTS,
    "tgi_batch_current_size": REQUESTS,
}

#: The sample names each engine's signals read, and the lines that can yield them.
READS: Mapping[str, frozenset[str]] = {
    engine: related(name for name in BOUNDS if name.startswith(prefix))
    for engine, prefix in (("vllm", "vllm:"), ("triton", "nv_inference_"), ("tgi", "tgi_"))}

#: The largest value each signal can take (what the checks above imply).
SIGNAL_BOUNDS: Mapping[str, float] = {
    "vllm-waiting": REQUESTS.limit, "vllm-running": REQUESTS.limit,
    "vllm-requests": 2 * REQUESTS.limit, "vllm-kv-cache": 100.0,
    **{r.signal: r.limit for r in VLLM_RATES},
    "triton-pending": REQUESTS.limit, "triton-queue-time": MAX_QUEUE_MS,
    "tgi-queue": REQUESTS.limit, "tgi-batch": REQUESTS.limit,
}


@dataclass(frozen=True, slots=True)
class EngineSignals:
    """One scrape's signals, and why any of them is UNAVAILABLE (for a person)."""

    signals: Mapping[str, Reading]
    problems: tuple[str, ...] = ()


class _Lines:
    """The body's lines as the parser splits them (on ``\n`` only, as StringIO does), or
    the selected ones with their numbers in the body, remembering which one it is on, for
    the message."""

    def __init__(self, text: str, selected: list[tuple[int, str]] | None = None) -> None:
        self._lines = io.StringIO(text) if selected is None else None
        self._selected = iter(selected or ())
        self.number = 0
        self.line = ""

    def __iter__(self) -> _Lines:
        return self

    def __next__(self) -> str:
        if self._lines is not None:
            self.line = next(self._lines)
            self.number += 1
        else:
            self.number, self.line = next(self._selected)
        return self.line


def _printable(s: str, limit: int = 100) -> str:
    return "".join(c if c.isprintable() else "?" for c in s[:limit])


def samples(text: str, only: frozenset[str] | None = None) -> dict[str, list[float]]:
    """Metric name -> the values of its samples, as sent: negative and non-finite values
    included (counters keep their ``_total`` name; integers too large for a float read as
    infinite). Raises EngineParseError, naming the line, for text that is not exposition
    format. ``only`` (from ``select.related``): parse only the lines that can yield those
    names (engines.select); the result on those names, and any error, are the same as for
    the whole text, and other names may be missing."""
    out: dict[str, list[float]] = {}
    count = 0
    selected = None if only is None else select_lines(text, only, MAX_SERIES)
    lines = _Lines(text, selected)
    try:
        # The parser only iterates its file: the counting iterator stands in for one.
        for family in text_fd_to_metric_families(cast("TextIO", lines)):
            for s in family.samples:
                count += 1
                if count > MAX_SERIES:
                    raise EngineParseError(f"line {lines.number}: more than {MAX_SERIES} "
                                           "samples")
                try:
                    value = float(s.value)
                except OverflowError:  # an integer literal beyond float range
                    value = math.inf if s.value > 0 else -math.inf
                out.setdefault(s.name, []).append(value)
    except EngineParseError:
        raise
    except (ValueError, TypeError, IndexError, KeyError, ArithmeticError) as exc:
        detail = _printable(str(exc)) or _printable(repr(lines.line.strip()), 60)
        raise EngineParseError(f"line {lines.number}: not Prometheus text format "
                               f"({detail})") from None
    return out


def _problem(name: str, values: list[float]) -> str | None:
    """Why ``values`` of metric ``name`` cannot be used, or None."""
    bound = BOUNDS[name]
    for x in values:
        if math.isnan(x):
            return f"{name} = NaN (not a number)"
        if math.isinf(x):
            return f"{name} = {'+Inf' if x > 0 else '-Inf'} (infinite, or too large)"
        if x < 0:
            return f"{name} = {x:g} (negative)"
        if x > bound.limit:
            return f"{name} = {x:g} (above {bound.limit:.15g}: {bound.why})"
    total = math.fsum(values)
    if total > bound.limit:
        return (f"{name} sums to {total:g} over {len(values)} series (above "
                f"{bound.limit:.15g}: {bound.why})")
    return None


class _Checked:
    """Reads metrics of one body for the signals, collecting what is unusable."""

    def __init__(self, values: Mapping[str, list[float]]) -> None:
        self.values = values
        self.problems: list[str] = []

    def _first(self, names: tuple[str, ...]) -> tuple[str, list[float]] | Absent:
        """The first of ``names`` the body has, checked (UNAVAILABLE when unusable)."""
        for name in names:
            if self.values.get(name):
                why = _problem(name, self.values[name])
                if why is not None:
                    self.problems.append(why)
                    return Absent.UNAVAILABLE
                return name, self.values[name]
        return Absent.NO_DATA

    def sum(self, *names: str) -> Reading:
        got = self._first(names)
        return got if isinstance(got, Absent) else math.fsum(got[1])

    def max(self, *names: str) -> Reading:
        got = self._first(names)
        return got if isinstance(got, Absent) else max(got[1])


def vllm_signals(values: Mapping[str, list[float]], scraped_at: float = 0.0,
                 rates: VllmRates | None = None) -> EngineSignals:
    """vLLM's signals; the rates need the pod's ``rates`` (no data without)."""
    read = _Checked(values)
    rated = (rates or VllmRates()).signals(values, scraped_at)
    kv = read.max("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    waiting = read.sum("vllm:num_requests_waiting")
    running = read.sum("vllm:num_requests_running")
    requests: Reading = (waiting if isinstance(waiting, Absent) else
                         running if isinstance(running, Absent) else waiting + running)
    return EngineSignals({
        "vllm-waiting": waiting,
        "vllm-running": running,
        "vllm-requests": requests,
        "vllm-kv-cache": kv if isinstance(kv, Absent) else 100.0 * kv,
        **rated.signals,
    }, (*read.problems, *rated.problems))


@dataclass
class VllmRates:
    """Counter history of one vLLM pod: each counter's value at the last scrape that had
    it, to turn vLLM's counters into rates over the latest scrape interval."""

    last: dict[str, tuple[float, float]] = field(default_factory=dict)  # counter -> t, n

    def signals(self, values: Mapping[str, list[float]], scraped_at: float,
                ) -> EngineSignals:
        """The rate signals of one scrape at monotonic time ``scraped_at``."""
        read = _Checked(values)
        out: dict[str, Reading] = {}
        now: dict[str, float] = {}
        for rate in VLLM_RATES:
            got = read.sum(rate.counter)
            if isinstance(got, Absent):
                out[rate.signal] = got
            else:
                now[rate.counter] = got
        if any(n < self.last[c][1] for c, n in now.items() if c in self.last):
            self.last.clear()  # a counter went back: the engine restarted
        before, self.last = self.last, {c: (scraped_at, n) for c, n in now.items()}
        for rate in VLLM_RATES:
            if rate.counter not in now:
                continue
            out[rate.signal] = Absent.NO_DATA
            if rate.counter not in before:
                continue
            t0, n0 = before[rate.counter]
            dt = scraped_at - t0
            if not (math.isfinite(dt) and dt > 0):
                continue  # no time between the scrapes: no rate
            rose = now[rate.counter] - n0
            value = rose / dt
            if value > rate.limit:  # also +inf, from a tiny dt
                read.problems.append(f"{rate.counter} rose by {rose:g} in {dt:g} s: "
                                     f"{value:g} {rate.unit} (above {rate.limit:.15g} "
                                     f"{rate.unit}: not plausible for one engine pod)")
                out[rate.signal] = Absent.UNAVAILABLE
            else:
                out[rate.signal] = value
        return EngineSignals({rate.signal: out[rate.signal] for rate in VLLM_RATES},
                             tuple(read.problems))


def tgi_signals(values: Mapping[str, list[float]]) -> EngineSignals:
    read = _Checked(values)
    return EngineSignals({"tgi-queue": read.sum("tgi_queue_size"),
                          "tgi-batch": read.sum("tgi_batch_current_size")},
                         tuple(read.problems))


@dataclass
class TritonWindow:
    """Counter history of one pod, to turn Triton's counters into a windowed mean."""

    window_s: float = TRITON_WINDOW_S
    history: deque[tuple[float, float, float]] = field(default_factory=deque)  # t, us, n

    def signals(self, values: Mapping[str, list[float]], scraped_at: float,
                ) -> EngineSignals:
        read = _Checked(values)
        pending = read.sum("nv_inference_pending_request_count")
        queue_us = read.sum("nv_inference_queue_duration_us_total",
                            "nv_inference_queue_duration_us")
        success = read.sum("nv_inference_request_success_total",
                           "nv_inference_request_success")
        queue_ms: Reading = Absent.NO_DATA
        if Absent.UNAVAILABLE in (queue_us, success):
            queue_ms = Absent.UNAVAILABLE  # the counters are unusable this scrape
        elif not isinstance(queue_us, Absent) and not isinstance(success, Absent):
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
                if queue_ms > MAX_QUEUE_MS:
                    read.problems.append(f"Triton's mean queue time over the window is "
                                         f"{queue_ms:g} ms (above {MAX_QUEUE_MS:.15g} ms: "
                                         "not plausible)")
                    queue_ms = Absent.UNAVAILABLE
        return EngineSignals({"triton-pending": pending, "triton-queue-time": queue_ms},
                             tuple(read.problems))


def engine_signals(engine: str, text: str, scraped_at: float,
                   triton: TritonWindow | None = None,
                   vllm: VllmRates | None = None) -> EngineSignals:
    """Signals of one scrape at monotonic time ``scraped_at``, with the pod's counter
    history (``triton`` or ``vllm``; without it, the rates have no data). Raises
    EngineParseError; ValueError for an unknown engine."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
    values = samples(text, READS[engine])
    if engine == "vllm":
        return vllm_signals(values, scraped_at, vllm)
    if engine == "tgi":
        return tgi_signals(values)
    return (triton or TritonWindow()).signals(values, scraped_at)


def unavailable(engine: str) -> dict[str, Reading]:
    """Every signal of ``engine`` marked unavailable (the scrape failed)."""
    names: Iterable[str] = {"vllm": ("vllm-waiting", "vllm-running", "vllm-requests",
                                     "vllm-kv-cache", *(r.signal for r in VLLM_RATES)),
                            "triton": ("triton-pending", "triton-queue-time"),
                            "tgi": ("tgi-queue", "tgi-batch")}.get(engine, ())
    return dict.fromkeys(names, Absent.UNAVAILABLE)
