"""Demand sources: pending work that exists before any GPU pod does (scale-from-zero).

With zero replicas there is no GPU signal, so the scaler's operator - not whoever writes a
ScaledObject - may declare named endpoints that count waiting work, and a ScaledObject
refers to one by name (``demandSource: gateway``). IsActive is then also true while the
source shows pending work. Declared in the scaler's YAML configuration::

    demandSources:
      - name: gateway                      # letters, digits, '-', '_'
        kind: metrics                      # a Prometheus-format /metrics endpoint ...
        url: http://llm-gateway.gateway.svc:9090/metrics
        metric: gateway_pending_requests   # gauge; samples matching `labels` are summed
        labels: {model: llama-8b}
      - name: queue
        kind: prometheus                   # ... or a Prometheus server's query API
        url: http://prometheus.monitoring.svc:9090
        query: sum(rabbitmq_queue_messages{queue="gpu-jobs"})
    interval_s: 2                          # optional, for every source (default 2)
    timeout_s: 1                           # optional (default 1)

Each source is polled in the background. A source that fails, answers something that is
not a count (JSON ``null``, ``[]``, an error, a negative or non-finite number) or has not
answered for three intervals cannot tell: a workload that depends on it and whose pods show
no load then answers UNAVAILABLE naming the source (KEDA's fallback holds its replicas)
rather than "inactive", which would leave it at zero while work waits. The failure is
logged and shown in ``state()``; other sources and workloads are untouched.

A poll - connect, headers and body - must end within ``timeout_s``; a body over
``MAX_BODY`` bytes is refused as soon as it is seen; redirects are not followed, and
nothing is taken from the environment (no proxies, no netrc). The HTTP client's errors stop
here: a poll that fails is a reading that says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

import httpx2

from gpuscale.common.bounded import read_bounded
from gpuscale.common.errors import ConfigError, DataUnavailable, PeerError
from gpuscale.common.http_client import check_port, describe, new_client, system_tls

log = logging.getLogger(__name__)

MAX_BODY = 4 * 1024 * 1024
MAX_SOURCES = 100
_NAME = re.compile(r"[A-Za-z0-9_-]{1,63}")


@dataclass(frozen=True, slots=True)
class DemandSource:
    name: str
    kind: str  # "metrics" | "prometheus"
    url: str
    metric: str = ""
    labels: tuple[tuple[str, str], ...] = ()
    query: str = ""


@dataclass(frozen=True, slots=True)
class DemandConfig:
    demand_sources: tuple[DemandSource, ...] = ()
    interval_s: float = 2.0
    timeout_s: float = 1.0


def parse_config(data: object) -> DemandConfig:
    if not isinstance(data, dict):
        raise ConfigError("configuration: expected a mapping")
    unknown = set(data) - {"demandSources", "interval_s", "timeout_s"}
    if unknown:
        raise ConfigError(f"configuration: unknown key(s) {sorted(map(str, unknown))}; "
                          f"allowed: demandSources, interval_s, timeout_s")
    interval = _positive(data.get("interval_s", 2.0), "interval_s")
    timeout = _positive(data.get("timeout_s", 1.0), "timeout_s")
    raw = data.get("demandSources", [])
    if not isinstance(raw, list) or len(raw) > MAX_SOURCES:
        raise ConfigError(f"demandSources: expected a list of at most {MAX_SOURCES} sources")
    sources = [_source(s, f"demandSources[{i}]") for i, s in enumerate(raw)]
    names = [s.name for s in sources]
    if len(set(names)) != len(names):
        raise ConfigError("demandSources: names must be unique")
    return DemandConfig(tuple(sources), interval, timeout)


def _positive(v: object, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v <= 3600:
        raise ConfigError(f"{where}: expected a number of seconds in (0, 3600]")
    return float(v)


def _source(s: object, where: str) -> DemandSource:
    if not isinstance(s, dict):
        raise ConfigError(f"{where}: expected a mapping")
    kind = s.get("kind", "metrics")
    if kind not in ("metrics", "prometheus"):
        raise ConfigError(f"{where}.kind: {kind!r} is not one of metrics, prometheus")
    allowed = {"name", "kind", "url"} | ({"metric", "labels"} if kind == "metrics"
                                         else {"query"})
    unknown = set(s) - allowed
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(map(str, unknown))} for kind "
                          f"{kind!r}; allowed: {sorted(allowed)}")
    name = s.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(f"{where}.name: letters, digits, '-' and '_' (1-63)")
    url = s.get("url")
    if not isinstance(url, str) or urlsplit(url).scheme not in ("http", "https") or \
            not urlsplit(url).hostname:
        raise ConfigError(f"{where}.url: an http(s) URL")
    if kind == "metrics":
        metric = s.get("metric")
        if not isinstance(metric, str) or not metric:
            raise ConfigError(f"{where}.metric: the metric name to read")
        labels = s.get("labels", {})
        if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                   for k, v in labels.items()):
            raise ConfigError(f"{where}.labels: a mapping of label names to values")
        return DemandSource(name, kind, url, metric, tuple(sorted(labels.items())))
    query = s.get("query")
    if not isinstance(query, str) or not query:
        raise ConfigError(f"{where}.query: a PromQL query whose result is the pending work")
    return DemandSource(name, kind, url, query=query)


@dataclass(frozen=True, slots=True)
class _Reading:
    value: float | None
    at: float
    error: str = ""


class DemandSources:
    def __init__(self, config: DemandConfig,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._by_name = {s.name: s for s in config.demand_sources}
        self._readings: dict[str, _Reading] = {}
        self._monotonic = monotonic

    def pending(self, name: str) -> bool:
        """Whether ``name`` shows pending work now. ConfigError when no such source is
        declared; DataUnavailable (with the source's error) when it cannot tell now."""
        if name not in self._by_name:
            raise ConfigError(f"demandSource: {name!r} is not declared in the scaler's "
                              f"configuration")
        r = self._readings.get(name)
        if r is None:
            raise DataUnavailable(f"demand source {name}: no answer yet")
        if r.value is None:
            raise DataUnavailable(f"demand source {name}: {r.error}")
        age = self._monotonic() - r.at
        if age > 3 * self.config.interval_s:
            raise DataUnavailable(f"demand source {name}: last answer {age:.0f}s old")
        return r.value > 0

    def state(self) -> Mapping[str, str]:
        return {n: (r.error or "ok") for n, r in self._readings.items()}

    async def run(self) -> None:
        if not self._by_name:
            await asyncio.Event().wait()
        async with self.session() as http:
            while True:
                await asyncio.gather(*(self._poll(http, s) for s in self._by_name.values()))
                await asyncio.sleep(self.config.interval_s)

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[httpx2.AsyncClient]:
        """The HTTP client every source is polled on: a keep-alive connection for each
        source at most, no proxies or other settings from the environment, no redirects,
        no cookies (a poll carries no session). https is verified against the system's
        CAs, as ``ssl.create_default_context`` finds them (``SSL_CERT_FILE`` included)."""
        async with new_client(self.config.timeout_s, await system_tls(),
                              connections=MAX_SOURCES) as client:
            yield client

    async def _poll(self, http: httpx2.AsyncClient, s: DemandSource) -> None:
        try:
            value = await (self._metrics(http, s) if s.kind == "metrics"
                           else self._prometheus(http, s))
            error = ""
        except (PeerError, ValueError) as exc:  # UnicodeDecodeError, JSONDecodeError too
            value, error = None, f"{type(exc).__name__}: {str(exc)[:160]}"
        except Exception as exc:  # a bug: this source cannot tell; the others, the scaler go on
            log.error("demand source %s failed: %s", s.name, exc, exc_info=exc)
            value, error = None, (f"internal error in gpuscale ({type(exc).__name__}); see "
                                  "the scaler's log")
        previous = self._readings.get(s.name)
        if error and (previous is None or previous.error != error):
            log.warning("demand source %s: %s", s.name, error)
        if not error and previous is not None and previous.error:
            log.info("demand source %s: readable again", s.name)
        self._readings[s.name] = _Reading(value, self._monotonic(), error)

    async def _get(self, http: httpx2.AsyncClient, url: str, only_200: bool) -> bytes:
        """The body of a GET of ``url``. ValueError("HTTP <status>") for another status
        when ``only_200`` (its body unread), BodyTooLarge past MAX_BODY, PeerError when the
        request fails or does not end within the timeout."""
        in_body = False
        try:
            check_port(url)
            async with asyncio.timeout(self.config.timeout_s), \
                    http.stream("GET", url) as resp:
                if only_200 and resp.status_code != 200:
                    raise ValueError(f"HTTP {resp.status_code}")
                in_body = True
                return await read_bounded(resp, MAX_BODY)
        except (TimeoutError, httpx2.TimeoutException):
            raise PeerError(f"no complete answer in {self.config.timeout_s:g} s") from None
        except httpx2.HTTPError as exc:
            raise PeerError(describe(exc, in_body)) from exc
        except httpx2.InvalidURL as exc:
            raise PeerError(f"the URL cannot be used: {exc}") from exc

    async def _metrics(self, http: httpx2.AsyncClient, s: DemandSource) -> float:
        from prometheus_client.parser import text_string_to_metric_families

        text = (await self._get(http, s.url, only_200=True)).decode()
        want = dict(s.labels)
        total, seen = 0.0, False
        try:
            for fam in text_string_to_metric_families(text):
                for sample in fam.samples:
                    if sample.name == s.metric and all(sample.labels.get(k) == v
                                                       for k, v in want.items()):
                        total += sample.value
                        seen = True
        except (TypeError, IndexError) as exc:
            raise PeerError(f"not Prometheus text exposition: {exc}") from None
        if not seen:
            raise ValueError(f"no sample of {s.metric} matching {want}")
        return count(total, s.metric)

    async def _prometheus(self, http: httpx2.AsyncClient, s: DemandSource) -> float:
        url = s.url.rstrip("/") + "/api/v1/query?" + urlencode({"query": s.query})
        raw = await self._get(http, url, only_200=False)
        try:
            body: Any = json.loads(raw)
        except RecursionError:  # not a ValueError: it would escape the poll
            raise PeerError("the reply is JSON nested too deep to read") from None
        return query_result(body)


def count(value: float, what: str) -> float:
    """A pending-work count: finite and not negative (PeerError otherwise)."""
    if not math.isfinite(value) or value < 0:
        raise PeerError(f"{what} = {value!r} is not a count of pending work")
    return value


def query_result(body: object) -> float:
    """The sum of a Prometheus instant query's answer (its JSON, already decoded): a scalar
    or a vector. Anything else - ``null``, a list, an error, a matrix, a missing or
    non-numeric field - is a PeerError saying what was wrong."""
    if not isinstance(body, dict):
        raise PeerError(f"the query API answered {type(body).__name__}, not a JSON object")
    if body.get("status") != "success":
        raise PeerError(f"query failed: {str(body.get('error'))[:120]}")
    data = body.get("data")
    if not isinstance(data, dict) or not isinstance(data.get("result"), list):
        raise PeerError("the answer has no data.result list")
    kind, result = data.get("resultType"), data["result"]
    if kind == "scalar":
        return count(_sample_value(result), "the scalar")
    if kind != "vector":
        raise PeerError(f"resultType {str(kind)[:20]!r}: the query must give a scalar or "
                        f"an instant vector")
    if not result:
        raise PeerError("the query returned no series")
    return count(sum(_sample_value(r.get("value") if isinstance(r, dict) else None)
                     for r in result), "the sum of the series")


def _sample_value(pair: object) -> float:
    """The value of a ``[timestamp, "value"]`` pair."""
    if not isinstance(pair, list) or len(pair) != 2 or not isinstance(pair[1], str):
        raise PeerError(f"a sample is {str(pair)[:60]}, not [timestamp, \"value\"]")
    try:
        return float(pair[1])
    except ValueError:
        raise PeerError(f"sample value {pair[1][:30]!r} is not a number") from None
