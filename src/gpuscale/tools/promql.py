"""Reading the agents' series from Prometheus's query API (``/api/v1/query_range`` and
``/api/v1/query``) for ``gpuscale idle``: the one seam to Prometheus. Replies are bounded
in size and time; an unreachable server, an error reply, or a body that is not the query
API's JSON becomes a ToolError that says which and what to do (the HTTP client's own errors
never leave this module).

Which series mean what (see agent/exporter.py): a device held by a pod has its dcgm series
labelled with the pod (``pod, namespace``; ``exported_pod, exported_namespace`` where the
scrape kept its own target labels), one series per holder on a time-sliced GPU. So
``DCGM_FI_DEV_FB_USED`` (GPUs, and each MIG instance) says who holds a device, and
``DCGM_FI_DEV_GPU_UTIL`` (GPUs, percent) and ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (MIG
instances, a ratio) how busy it is. ``kube_pod_owner`` and ``kube_replicaset_owner``
(kube-state-metrics), when present, name each pod's workload.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import urllib.parse
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx2

from gpuscale.common.bounded import BodyTooLarge, read_bounded
from gpuscale.common.errors import ConfigError
from gpuscale.common.http_client import check_port, describe, new_client, system_tls
from gpuscale.tools.client import ToolError
from gpuscale.tools.idle import Device
from gpuscale.tools.idle_sources import Series, devices_from_matrices

TIMEOUT_S = 30.0
MAX_BODY = 64 * 1024 * 1024
MAX_SERIES = 200_000
MAX_POINTS = 11_000  # Prometheus's own limit per series of a range query
MIN_STEP = 60.0

HELD = "count_over_time(DCGM_FI_DEV_FB_USED[{r}])"
UTILIZATION = ("avg_over_time(DCGM_FI_DEV_GPU_UTIL[{r}]) or "
               "100 * avg_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE[{r}])")
MEMORY = ("last_over_time(gpuscale_mig_memory_total_bytes[{r}]) or "
          "last_over_time(gpuscale_gpu_memory_total_bytes[{r}])")
POD_OWNER = ("max by (namespace, pod, owner_kind, owner_name) "
             "(last_over_time(kube_pod_owner[{r}]))")
RS_OWNER = ("max by (namespace, replicaset, owner_kind, owner_name) "
            "(last_over_time(kube_replicaset_owner[{r}]))")


def check_url(url: str) -> str:
    """``url`` without a trailing slash, or ConfigError unless it is http(s)://host[...]."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query \
            or parts.fragment or len(url) > 2000:
        raise ConfigError(f"--prometheus: {url[:80]!r} is not a Prometheus URL (e.g. "
                        f"http://prometheus.monitoring:9090)")
    return url.rstrip("/")


class Prometheus:
    def __init__(self, url: str, timeout_s: float = TIMEOUT_S, max_body: int = MAX_BODY) -> None:
        self.url = check_url(url)
        self._timeout = timeout_s
        self._max_body = max_body

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[httpx2.AsyncClient]:
        """The HTTP client for this server's queries: nothing from the environment (no
        proxies, no netrc), no redirects, no cookies; https verified against the system's
        CAs as ``ssl.create_default_context`` finds them (``SSL_CERT_FILE`` included)."""
        async with new_client(self._timeout, await system_tls()) as client:
            yield client

    async def range(self, session: httpx2.AsyncClient, expr: str, start: float,
                    end: float, step: float) -> list[Series]:
        data = await self._get(session, "query_range", {
            "query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"})
        return _result(data, "matrix", expr)

    async def instant(self, session: httpx2.AsyncClient, expr: str,
                      at: float) -> list[Series]:
        data = await self._get(session, "query", {"query": expr, "time": f"{at:.3f}"})
        return _result(data, "vector", expr)

    async def _get(self, session: httpx2.AsyncClient, api: str,
                   params: Mapping[str, str]) -> Mapping[str, Any]:
        where = f"Prometheus at {self.url}"
        in_body = False
        try:
            check_port(self.url)
            async with asyncio.timeout(self._timeout), session.stream(
                    "GET", f"{self.url}/api/v1/{api}", params=params) as resp:
                in_body = True
                body = await read_bounded(resp, self._max_body)
                status, ctype = resp.status_code, resp.headers.get("Content-Type", "")
        except BodyTooLarge:
            raise ToolError(f"{where}: the reply is over {self._max_body} bytes; "
                            f"narrow it with --namespace or a shorter --window") from None
        except (TimeoutError, httpx2.TimeoutException):
            raise ToolError(f"{where} did not answer within {self._timeout:g} s") from None
        except (httpx2.HTTPError, httpx2.InvalidURL, OSError, ValueError) as exc:
            why = (describe(exc, in_body) if isinstance(exc, httpx2.HTTPError)
                   else str(exc)[:200] or type(exc).__name__)
            raise ToolError(f"{where} could not be reached ({why}): "
                            f"check --prometheus (in a cluster: kubectl port-forward to "
                            f"it), or leave it out to read the scaler") from None
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
            data = None
        if not isinstance(data, dict) or data.get("status") not in ("success", "error"):
            raise ToolError(f"{where} answered HTTP {status} with something that is not the "
                            f"query API's JSON ({ctype[:60] or 'no content type'}, "
                            f"{body[:60]!r}): is the URL Prometheus's?")
        if data["status"] == "error":
            kind = str(data.get("errorType", ""))[:40]
            raise ToolError(f"{where} refused the query (HTTP {status}, {kind}): "
                            f"{str(data.get('error', ''))[:300]}")
        inner = data.get("data")
        if not isinstance(inner, dict):
            raise ToolError(f"{where}: the reply has no data object")
        return inner


def _result(data: Mapping[str, Any], kind: str, expr: str) -> list[Series]:
    """The result as Series, or ToolError for any shape the query API does not give."""
    bad = f"Prometheus's reply to {expr[:60]!r} is malformed"
    if data.get("resultType") != kind or not isinstance(data.get("result"), list):
        raise ToolError(f"{bad}: expected a {kind}, got {str(data.get('resultType'))[:20]!r}")
    result = data["result"]
    if len(result) > MAX_SERIES:
        raise ToolError(f"{bad}: over {MAX_SERIES} series")
    out = []
    for item in result:
        metric = item.get("metric") if isinstance(item, dict) else None
        raw = item.get("values" if kind == "matrix" else "value") if isinstance(item, dict) \
            else None
        if kind == "vector":
            raw = [raw]
        if not isinstance(metric, dict) or not isinstance(raw, list) or len(raw) > MAX_POINTS \
                or not all(isinstance(k, str) and isinstance(v, str)
                           for k, v in metric.items()):
            raise ToolError(f"{bad}: a series without labels or points")
        points = []
        for p in raw:
            if not (isinstance(p, list) and len(p) == 2 and isinstance(p[0], int | float)
                    and not isinstance(p[0], bool) and isinstance(p[1], str)):
                raise ToolError(f"{bad}: a point is not [time, \"value\"]")
            try:
                value = float(p[1])
            except ValueError:
                raise ToolError(f"{bad}: {p[1][:20]!r} is not a number") from None
            if math.isfinite(p[0]) and not math.isnan(value):
                points.append((float(p[0]), value))
        out.append(Series(dict(metric), tuple(points)))
    return out


def step_for(window_s: float) -> float:
    """Whole minutes, and few enough points for Prometheus's per-query limit."""
    return max(MIN_STEP, math.ceil(window_s / (MAX_POINTS - 1) / MIN_STEP) * MIN_STEP)


async def read_devices(prom: Prometheus, now: float, window_s: float) -> list[Device]:
    """The devices' buckets over the window: evaluated at each bucket's end (a multiple of
    the step, so buckets line up with the scaler's minutes), the last bucket the one now
    is in."""
    step = step_for(window_s)
    end = math.floor(now / step) * step + step
    start = math.floor((now - window_s) / step) * step + step
    r = f"{step:g}s"
    whole = f"{max(window_s, step):.0f}s"
    async with prom.session() as session:
        held, util, memory, pod_owner, rs_owner = await asyncio.gather(
            prom.range(session, HELD.format(r=r), start, end, step),
            prom.range(session, UTILIZATION.format(r=r), start, end, step),
            prom.instant(session, MEMORY.format(r=whole), now),
            prom.instant(session, POD_OWNER.format(r=whole), now),
            prom.instant(session, RS_OWNER.format(r=whole), now))
    # A point at t is the bucket [t - step, t): the selectors cover (t - step, t].
    return devices_from_matrices(held, util, memory, step, owners(pod_owner, rs_owner))


def owners(pod_owner: list[Series], rs_owner: list[Series]) -> dict[str, str]:
    """"namespace/pod" -> "Kind/name", a ReplicaSet resolved to its Deployment."""
    rs = {(s.labels.get("namespace", ""), s.labels.get("replicaset", "")):
          f"{s.labels.get('owner_kind', '')}/{s.labels.get('owner_name', '')}"
          for s in rs_owner if s.labels.get("owner_kind") not in (None, "", "<none>")}
    out = {}
    for s in pod_owner:
        ns, kind, name = (s.labels.get(k, "") for k in ("namespace", "owner_kind",
                                                         "owner_name"))
        if not kind or kind == "<none>" or not name:
            continue
        out[f"{ns}/{s.labels.get('pod', '')}"] = rs.get((ns, name), f"{kind}/{name}") \
            if kind == "ReplicaSet" else f"{kind}/{name}"
    return out
