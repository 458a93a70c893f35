"""The agent's engine scraper: /metrics of the pods that hold GPUs on this node and opt in.

A pod opts in with ``gpuscale.io/engine: vllm|triton|tgi``, and may set
``gpuscale.io/metrics-port`` (default 8000 for vLLM and Triton's 8002, 80 for TGI) and
``gpuscale.io/metrics-path`` (default ``/metrics``). The agent fetches
``http://<pod IP>:<port><path>`` - the pod IP from the API, an IP literal, never a name -
only for pods that hold GPUs on its own node (the latest attribution's pods): an annotated
pod without GPUs is never fetched (logged once), so bodies in memory are bounded by the
node's GPU pods, not by whoever annotates a pod. A GPU pod whose annotations cannot be used
(an unknown engine, a bad port or path, no IP yet) is not fetched either; its reading says
why. While attribution is unavailable the last known GPU pods keep being scraped; before
the first attribution, none are.

Each pod has its own task and cadence: its reading lands when its own scrape ends, so a
slow engine never holds back another pod's update. One scrape - connect, headers and
body - must finish within ``timeout`` (a body that drips a byte at a time is cut), a body
over ``max_body`` bytes is refused as soon as it is seen, and at most ``MAX_CONCURRENT``
scrapes are in flight (memory: that many bodies at most; more stalled pods than that would
make the others wait for a slot). Bodies are parsed in one worker thread, one at a time,
so a large body does not stall the event loop. A failed scrape makes all of the pod's
engine signals UNAVAILABLE, and a scrape with unusable values (engines.signals) those
signals, until the next success; ``EngineReading.error`` says why in words a person can
act on, and the log says it once per pod and reason. Triton's windowed mean and vLLM's
rates need each pod's counters from earlier scrapes: that history is the pod's own, timed
by the end of each body's read. Pods that leave (the node, or the attribution) are dropped
at once, with their history, and their tasks stopped. Nothing here is driven by
ScaledObject metadata.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import re
import ssl
import time
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx2

from gpuscale.attribution.model import AttributionState, NodeAttribution, PodInfo
from gpuscale.common.bounded import BodyTooLarge, read_bounded
from gpuscale.common.http_client import describe, new_client
from gpuscale.engines.signals import (
    ENGINES,
    EngineParseError,
    EngineSignals,
    TritonWindow,
    VllmRates,
    engine_signals,
    unavailable,
)
from gpuscale.telemetry.model import Absent, Reading

log = logging.getLogger(__name__)

ANNOTATION = "gpuscale.io/engine"
PORT_ANNOTATION = "gpuscale.io/metrics-port"
PATH_ANNOTATION = "gpuscale.io/metrics-path"
DEFAULT_PORTS = {"vllm": 8000, "triton": 8002, "tgi": 80}
MAX_BODY_BYTES = 1024 * 1024  # a real vLLM /metrics is 50-200 KiB
TIMEOUT_S = 2.0
MAX_CONCURRENT = 16

PodKey = tuple[str, str]  # (namespace, pod)
# The scraper's TLS context: it speaks plain HTTP only (target URLs are http://<pod IP>),
# so this trusts no CA and costs no CA bundle in memory; were it ever used, it would
# verify and fail.
_NO_TLS = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
_DIGITS = re.compile(r"\d+")


@dataclass(frozen=True, slots=True)
class Target:
    namespace: str
    pod: str
    engine: str
    url: str


@dataclass(frozen=True, slots=True)
class EngineReading:
    """One pod's latest scrape. ``error`` is empty when every signal is a number or
    NO_DATA; otherwise it says why the UNAVAILABLE ones are (the scrape failed, or which
    metric had which unusable value)."""

    signals: Mapping[str, Reading]
    scraped_at: float  # monotonic time the scrape ended
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
    """Scrapes the opted-in GPU pods of this node, each on its own cadence;
    ``readings()`` never blocks.

    ``pods``: this node's pods (the pod cache). ``attribution``: the latest attribution
    (None before the first); its ``pods`` are the ones holding GPUs."""

    def __init__(self, pods: Callable[[], Mapping[PodKey, PodInfo] | Absent],
                 attribution: Callable[[], NodeAttribution | None],
                 interval: float = 1.0, timeout: float = TIMEOUT_S,
                 max_body: int = MAX_BODY_BYTES,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        if max_body < 1:
            raise ValueError(f"engine body limit must be positive, got {max_body}")
        self._pods = pods
        self._attribution = attribution
        self._interval = interval
        self._timeout = timeout
        self._max_body = max_body
        self._monotonic = monotonic
        self._readings: dict[PodKey, EngineReading] = {}
        self._targets: dict[PodKey, Target] = {}
        self._tasks: dict[PodKey, asyncio.Task[None]] = {}
        self._starting: set[PodKey] = set()  # not Ready: failures are expected, not warned
        self._gpu_pods: frozenset[PodKey] | None = None  # None: not known yet
        self._skipped: dict[PodKey, str] = {}  # annotated pods not scraped: reason logged
        # Counter history per pod (Triton's windowed mean, vLLM's rates): a pod's own,
        # forgotten with the pod, so a new pod (or a new IP) starts a fresh history.
        self._triton: dict[PodKey, TritonWindow] = {}
        self._vllm: dict[PodKey, VllmRates] = {}
        self._logged: dict[PodKey, str] = {}
        self._limit = asyncio.Semaphore(MAX_CONCURRENT)
        self._parser = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine-parse")

    def readings(self) -> dict[PodKey, EngineReading]:
        """The latest reading of each scraped pod (a copy); pods not scraped yet have
        none."""
        return dict(self._readings)

    def targets(self) -> dict[PodKey, Target]:
        """The pods being scraped now."""
        return dict(self._targets)

    async def run(self) -> None:
        """Follow the node's GPU pods until cancelled: a task per pod, stopped with it."""
        try:
            async with asyncio.TaskGroup() as tg:
                def start(key: PodKey, t: Target) -> asyncio.Task[None]:
                    return tg.create_task(self._follow(key, t),
                                          name=f"engine-scrape {key[0]}/{key[1]}")

                while True:
                    try:
                        self.reconcile(start)
                    except Exception:  # a bug: the running pods keep their tasks
                        log.exception("engine scraper: cannot follow the node's pods")
                    await asyncio.sleep(self._interval)
        finally:
            self._tasks.clear()
            self._parser.shutdown(wait=False, cancel_futures=True)

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[httpx2.AsyncClient]:
        """An HTTP client for one pod's scrapes (each pod has its own, so finding a pod's
        connection is not a search through every pod's: httpx2's pool looks at each of its
        connections on every request). No proxies or other settings from the environment,
        no redirects, no cookies, one keep-alive connection, plain HTTP only (its TLS
        context trusts no CA: nothing is loaded for it). It asks for bodies uncompressed (a
        gzip body is inflated in memory anyway, and inflating costs CPU); one sent
        compressed all the same is inflated, and the body limit counts the inflated
        bytes."""
        async with new_client(self._timeout, _NO_TLS, connections=1, headers={
                "Accept": "text/plain", "Accept-Encoding": "identity"}) as client:
            yield client

    def reconcile(self, start: Callable[[PodKey, Target], asyncio.Task[None]]) -> None:
        """Bring the per-pod tasks in line with the pods that hold GPUs here and opt in:
        ``start`` the new ones, stop and forget the ones that left or changed target."""
        pods = self._pods()
        att = self._attribution()
        if att is not None and att.state is not AttributionState.UNAVAILABLE:
            self._gpu_pods = frozenset((u.namespace, u.pod) for u in att.pods)
        if isinstance(pods, Absent) or self._gpu_pods is None:
            return  # nothing known to change: keep what runs
        wanted: dict[PodKey, Target] = {}
        skipped: dict[PodKey, tuple[str, int]] = {}  # reason, log level
        invalid: dict[PodKey, str] = {}  # GPU pods whose annotations cannot be used
        for key, info in pods.items():
            t = target_for(info)
            if t is None:
                continue
            if key not in self._gpu_pods:  # a starting pod may not hold its GPU yet
                skipped[key] = (f"annotated {ANNOTATION} but holds no GPU on this node; "
                                "only pods with GPUs here are scraped",
                                logging.INFO if info.ready else logging.DEBUG)
            elif isinstance(t, str):
                invalid[key] = t
                skipped[key] = (t, logging.WARNING if info.ready else logging.INFO)
            else:
                wanted[key] = t
                if info.ready:
                    self._starting.discard(key)
                else:
                    self._starting.add(key)
        for key, (why, level) in skipped.items():
            if self._skipped.get(key) != why:
                log.log(level, "%s/%s: engine metrics not scraped: %s", *key, why)
        self._skipped = {key: why for key, (why, _) in skipped.items()}
        for key in [k for k, t in self._targets.items() if wanted.get(k) != t]:
            self._stop(key)
        for key in [k for k in self._readings if k not in wanted]:
            del self._readings[key]
        for key, why in invalid.items():
            # The pod's engine signals are unusable, and the reading says why (an unknown
            # engine has no signals to mark).
            engine = dict(pods[key].annotations)[ANNOTATION]
            self._readings[key] = EngineReading(unavailable(engine), self._monotonic(), why)
        for key, t in wanted.items():
            if key not in self._targets:
                self._readings.pop(key, None)  # an earlier annotation problem's reading
                self._targets[key] = t
                self._tasks[key] = start(key, t)

    def _stop(self, key: PodKey) -> None:
        task = self._tasks.pop(key, None)
        if task is not None:
            task.cancel()
        self._targets.pop(key, None)
        self._readings.pop(key, None)
        self._triton.pop(key, None)
        self._vllm.pop(key, None)
        self._logged.pop(key, None)
        self._starting.discard(key)

    async def _follow(self, key: PodKey, t: Target) -> None:
        """Scrape one pod every interval until stopped; each reading lands on its own."""
        async with self.session() as http:
            await self._scrape_every_interval(http, key, t)

    async def _scrape_every_interval(self, http: httpx2.AsyncClient, key: PodKey,
                                     t: Target) -> None:
        while True:
            began = self._monotonic()
            try:
                reading = await self.scrape(http, t)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug: say so, keep the pod UNAVAILABLE, keep going
                log.exception("%s/%s: engine scrape failed", *key)
                reading = EngineReading(unavailable(t.engine), self._monotonic(),
                                        "engine scrape failed (a gpuscale bug; see the "
                                        "agent log)")
            if self._targets.get(key) is not t:
                return  # stopped meanwhile: leave no reading behind
            self._readings[key] = reading
            await asyncio.sleep(max(0.0, began + self._interval - self._monotonic()))

    async def scrape(self, http: httpx2.AsyncClient, t: Target) -> EngineReading:
        """One scrape of ``t``: its signals, or all UNAVAILABLE with the reason."""
        key = (t.namespace, t.pod)
        async with self._limit:
            in_body = False
            try:
                async with asyncio.timeout(self._timeout), http.stream("GET", t.url) as resp:
                    if resp.status_code != 200:
                        why = f"HTTP {resp.status_code}"
                        if 300 <= resp.status_code < 400:
                            why += " (redirects are not followed)"
                        return self._fail(key, t, why)
                    in_body = True
                    body = await read_bounded(resp, self._max_body)
            except BodyTooLarge as exc:
                return self._fail(key, t, f"{exc} (the limit is --engine-max-body-bytes)")
            except (TimeoutError, httpx2.TimeoutException):
                return self._fail(key, t, f"no complete answer in {float(self._timeout)}s")
            except httpx2.HTTPError as exc:
                return self._fail(key, t, describe(exc, in_body))
            triton = (self._triton.setdefault(key, TritonWindow()) if t.engine == "triton"
                      else None)
            vllm = self._vllm.setdefault(key, VllmRates()) if t.engine == "vllm" else None
            loop = asyncio.get_running_loop()
            try:
                got = await loop.run_in_executor(self._parser, _parse, t.engine, body,
                                                 self._monotonic(), triton, vllm)
            except EngineParseError as exc:
                return self._fail(key, t, str(exc)[:200])
        scraped = self._monotonic()
        error = "; ".join(got.problems)
        if error:
            self._note(key, t, error)
        elif self._logged.pop(key, None):
            log.info("%s/%s: engine metrics readable again", *key)
        return EngineReading(got.signals, scraped, error)

    def _fail(self, key: PodKey, t: Target, why: str) -> EngineReading:
        self._note(key, t, why)
        return EngineReading(unavailable(t.engine), self._monotonic(), why)

    def _note(self, key: PodKey, t: Target, why: str) -> None:
        if key in self._starting:
            log.debug("%s/%s: not Ready, engine not answering yet: %s", *key, why)
            return
        pods = self._pods()
        info = None if isinstance(pods, Absent) else pods.get(key)
        if not isinstance(pods, Absent) and (info is None or not info.ready):
            # Going away (deleted, or no longer Ready): its engine stopping is expected;
            # the reading still says why, for whoever asks.
            log.debug("%s/%s: going away, engine not answering: %s", *key, why)
            return
        # Once per pod and kind of reason: an engine whose bad value changes every scrape
        # (-43, then -44) is said once, not every interval.
        shape = _DIGITS.sub("#", why)
        if self._logged.get(key) != shape:
            self._logged[key] = shape
            log.warning("%s/%s: cannot use engine metrics from %s: %s", *key, t.url, why)


def _parse(engine: str, body: bytes, scraped_at: float, triton: TritonWindow | None,
           vllm: VllmRates | None) -> EngineSignals:
    """Decode and parse one body (in the parser thread). Raises EngineParseError."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise EngineParseError(f"body is not UTF-8 (byte 0x{body[exc.start]:02x} at offset "
                               f"{exc.start})") from None
    return engine_signals(engine, text, scraped_at, triton, vllm)
