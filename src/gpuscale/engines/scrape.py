"""The agent's engine scraper: /metrics of pods on this node that opt in by annotation.

A pod opts in with ``gpuscale.io/engine: vllm|triton|tgi``, and may set
``gpuscale.io/metrics-port`` (default 8000 for vLLM and Triton's 8002, 80 for TGI) and
``gpuscale.io/metrics-path`` (default ``/metrics``). The agent fetches
``http://<pod IP>:<port><path>`` - the pod IP from the API, an IP literal, never a name -
only for pods on its own node. Each scrape has a timeout and a body limit; a pod whose
scrape fails has its engine signals UNAVAILABLE (logged once per pod and reason) until the
next success. Nothing here is driven by ScaledObject metadata.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import aiohttp

from gpuscale.attribution.model import PodInfo
from gpuscale.common.bounded import BodyTooLarge, read_bounded
from gpuscale.engines.signals import (
    ENGINES,
    EngineParseError,
    TritonWindow,
    engine_signals,
    unavailable,
)
from gpuscale.telemetry.model import Absent, Reading

log = logging.getLogger(__name__)

ANNOTATION = "gpuscale.io/engine"
PORT_ANNOTATION = "gpuscale.io/metrics-port"
PATH_ANNOTATION = "gpuscale.io/metrics-path"
DEFAULT_PORTS = {"vllm": 8000, "triton": 8002, "tgi": 80}
MAX_BODY_BYTES = 8 * 1024 * 1024
TIMEOUT_S = 2.0
MAX_CONCURRENT = 16


@dataclass(frozen=True, slots=True)
class Target:
    namespace: str
    pod: str
    engine: str
    url: str


@dataclass(frozen=True, slots=True)
class EngineReading:
    signals: Mapping[str, Reading]
    scraped_at: float  # monotonic time of the scrape that produced these numbers
    error: str = ""


def target_for(pod: PodInfo) -> Target | str | None:
    """The scrape target of an opted-in pod, a reason it cannot be scraped, or None when the
    pod did not opt in."""
    ann = dict(pod.annotations)
    engine = ann.get(ANNOTATION)
    if engine is None:
        return None
    if engine not in ENGINES:
        return f"{ANNOTATION}={engine[:40]!r} is not one of {', '.join(ENGINES)}"
    try:
        port = int(ann.get(PORT_ANNOTATION, DEFAULT_PORTS[engine]))
    except ValueError:
        return f"{PORT_ANNOTATION} is not a port number"
    if not 0 < port < 65536:
        return f"{PORT_ANNOTATION} {port} is not a port number"
    path = ann.get(PATH_ANNOTATION, "/metrics")
    if not path.startswith("/") or any(c in path for c in "?#@\\ \t\r\n") or len(path) > 256:
        return f"{PATH_ANNOTATION} must be a plain absolute path"
    try:
        ip = ipaddress.ip_address(pod.ip)
    except ValueError:
        return "pod has no IP yet"
    host = f"[{ip}]" if ip.version == 6 else str(ip)
    return Target(pod.namespace, pod.name, engine, f"http://{host}:{port}{path}")


class EngineScraper:
    """Scrapes every opted-in pod on its own cadence; ``readings()`` never blocks."""

    def __init__(self, pods: Callable[[], Mapping[tuple[str, str], PodInfo] | Absent],
                 interval: float = 1.0, timeout: float = TIMEOUT_S,
                 max_body: int = MAX_BODY_BYTES,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._pods = pods
        self._interval = interval
        self._timeout = timeout
        self._max_body = max_body
        self._monotonic = monotonic
        self._readings: dict[tuple[str, str], EngineReading] = {}
        self._triton: dict[tuple[str, str], TritonWindow] = {}
        self._logged: dict[tuple[str, str], str] = {}
        self._limit = asyncio.Semaphore(MAX_CONCURRENT)
        self._client_timeout = aiohttp.ClientTimeout(total=timeout, sock_connect=timeout)

    def readings(self) -> dict[tuple[str, str], EngineReading]:
        return self._readings

    async def run(self) -> None:
        connector = aiohttp.TCPConnector(limit=MAX_CONCURRENT, use_dns_cache=False)
        async with aiohttp.ClientSession(connector=connector, trust_env=False) as http:
            while True:
                started = self._monotonic()
                await self.scrape_once(http)
                await asyncio.sleep(max(0.0, self._interval - (self._monotonic() - started)))

    async def scrape_once(self, http: aiohttp.ClientSession) -> None:
        pods = self._pods()
        if isinstance(pods, Absent):
            return
        jobs: dict[tuple[str, str], Target] = {}
        starting = set()
        for key, info in pods.items():
            t = target_for(info)
            if isinstance(t, Target):
                jobs[key] = t
                if not info.ready:
                    starting.add(key)
            elif isinstance(t, str):
                self._fail(key, ANNOTATION, t, "")
        results = await asyncio.gather(*(self._scrape(http, t, k in starting)
                                         for k, t in jobs.items()))
        readings = dict(zip(jobs, results, strict=True))
        self._readings = readings  # pods that went away drop out
        self._triton = {k: v for k, v in self._triton.items() if k in readings}

    async def _scrape(self, http: aiohttp.ClientSession, t: Target,
                      starting: bool = False) -> EngineReading:
        """``starting``: the pod is not Ready; an engine that does not answer yet is still
        loading its model, which is logged at debug level, not as a warning."""
        key = (t.namespace, t.pod)
        async with self._limit:
            try:
                async with http.get(t.url, allow_redirects=False, timeout=self._client_timeout,
                                    headers={"Accept": "text/plain"}) as resp:
                    if resp.status != 200:
                        return self._fail(key, t.url, f"HTTP {resp.status}", t.engine)
                    body = await read_bounded(resp, self._max_body)
            except BodyTooLarge as exc:
                return self._fail(key, t.url, str(exc), t.engine)
            except TimeoutError:
                return self._fail(key, t.url, f"no answer in {self._timeout}s", t.engine)
            except aiohttp.ClientError as exc:
                return self._fail(key, t.url, type(exc).__name__, t.engine, starting)
        scraped = self._monotonic()
        try:
            text = body.decode("utf-8")
            window = self._triton.setdefault(key, TritonWindow())
            signals = engine_signals(t.engine, text, scraped, window)
        except (UnicodeDecodeError, EngineParseError) as exc:
            return self._fail(key, t.url, str(exc)[:160], t.engine)
        if self._logged.pop(key, None):
            log.info("%s/%s: engine metrics readable again", *key)
        return EngineReading(signals, scraped)

    def _fail(self, key: tuple[str, str], where: str, why: str, engine: str,
              starting: bool = False) -> EngineReading:
        if starting:
            log.debug("%s/%s: not Ready, engine not answering yet: %s", *key, why)
        elif self._logged.get(key) != why:
            self._logged[key] = why
            log.warning("%s/%s: cannot read engine metrics from %s: %s", *key, where, why)
        return EngineReading(unavailable(engine), self._monotonic(), why)
