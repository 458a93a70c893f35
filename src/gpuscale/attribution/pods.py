"""Node pod cache: list+watch of the pods on this node through the Kubernetes API.

Three layers, each owning one failure (after kopf): ``run`` reconnects with jittered
backoff; ``_sync`` lists, then watches from the list's resourceVersion and relists on
410 Gone; the watch itself uses bookmarks and an inactivity timeout (a silent server is a
dead one). Between failures the last known pods are kept and served; ``state`` says how old
they are. ``ApiException`` and aiohttp errors do not leave this module.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.watch import Watch

from gpuscale.attribution.model import OwnerRef, PodInfo, PodPhase
from gpuscale.bounded import read_bounded
from gpuscale.telemetry.model import Absent

log = logging.getLogger(__name__)

WATCH_TIMEOUT_S = 300  # server-side watch length; then resume from the last resourceVersion
INACTIVITY_S = 90.0  # no byte (event or bookmark) for this long: reconnect
BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
MAX_LABELS = 64  # per pod, bounded label cardinality downstream
MAX_PODS = 10_000


class Gone(Exception):
    """The resourceVersion is too old (410): relist."""


def pod_info(raw: Mapping[str, Any], owner: OwnerRef | None = None) -> PodInfo:
    """A PodInfo from a pod as the API returns it (JSON). ``owner`` overrides the direct
    controller (the cache resolves ReplicaSet -> Deployment and Job -> CronJob)."""
    meta = raw.get("metadata") or {}
    status = raw.get("status") or {}
    if owner is None:
        owner = direct_owner(meta)
    ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                for c in status.get("conditions") or [])
    ids = []
    for cs in (status.get("containerStatuses") or []) + (status.get("initContainerStatuses")
                                                         or []):
        cid = str(cs.get("containerID") or "")
        if cid:
            ids.append((str(cs.get("name", "")), cid.split("://", 1)[-1]))
    phases = {p.value: p for p in PodPhase}
    return PodInfo(
        namespace=str(meta.get("namespace", "")), name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        labels=tuple(sorted((str(k), str(v)) for k, v in (meta.get("labels") or {}).items()))
        [:MAX_LABELS],
        annotations=tuple(sorted((str(k), str(v)[:1024])
                                 for k, v in (meta.get("annotations") or {}).items()
                                 if str(k).startswith("gpuscale.io/"))),
        owner=owner, phase=phases.get(str(status.get("phase")), PodPhase.UNKNOWN),
        ready=ready, ip=str(status.get("podIP") or ""), container_ids=tuple(ids))


def direct_owner(meta: Mapping[str, Any]) -> OwnerRef | None:
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller"):
            return OwnerRef(str(ref.get("kind", "")), str(ref.get("name", "")))
    return None


class NodePodCache:
    """Pods on ``node``, kept current by a watch. ``pods()`` never blocks or does I/O."""

    def __init__(self, api: client.ApiClient, node: str,
                 monotonic: Callable[[], float] = time.monotonic,
                 inactivity_s: float = INACTIVITY_S,
                 backoff_s: tuple[float, ...] = BACKOFF_S) -> None:
        self._api = api
        self._core = client.CoreV1Api(api)
        self._node = node
        self._monotonic = monotonic
        self._inactivity_s = inactivity_s
        self._backoff_s = backoff_s
        self._raw: dict[str, dict[str, Any]] = {}  # uid -> pod JSON
        self._pods: dict[tuple[str, str], PodInfo] = {}
        self._owners: dict[tuple[str, str, str], OwnerRef | None] = {}  # (ns, kind, name)
        self._synced_at: float | None = None
        self._rv = ""
        self._error = ""
        self.events = 0
        self.relists = 0

    def pods(self) -> Mapping[tuple[str, str], PodInfo] | Absent:
        """(namespace, name) -> PodInfo, or UNAVAILABLE before the first successful list."""
        return Absent.UNAVAILABLE if self._synced_at is None else self._pods

    def state(self) -> tuple[bool, str]:
        """(connected, reason). Disconnected with a cache means "serving the last known"."""
        if self._error:
            return False, self._error
        return self._synced_at is not None, "ok" if self._synced_at else "not listed yet"

    async def run(self, ready: Callable[[], None] | None = None) -> None:
        attempt = 0
        while True:
            try:
                await self._sync(ready)
                attempt = 0
            except Gone:
                self.relists += 1
                continue
            except asyncio.CancelledError:
                raise
            except (ApiException, aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
                reason = _describe(exc)
                if reason != self._error:
                    log.warning("pod watch on node %s: %s; retrying", self._node, reason)
                self._error = reason
                delay = self._backoff_s[min(attempt, len(self._backoff_s) - 1)]
                attempt += 1
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))

    async def _sync(self, ready: Callable[[], None] | None) -> None:
        self._rv = await self._list()
        if self._error:
            log.info("pod watch on node %s: connected again", self._node)
        self._error = ""
        if ready is not None:
            ready()
        dropped = 0
        while True:
            try:
                await self._watch()
                dropped = 0
            except (aiohttp.ClientError, TimeoutError) as exc:
                # A dropped or silent connection: resume from the last resourceVersion seen
                # (events or bookmarks); only repeated failures fall back to a relist.
                dropped += 1
                if dropped > len(self._backoff_s):
                    raise
                log.debug("pod watch dropped (%s); resuming from %s", exc, self._rv)
                await asyncio.sleep(self._backoff_s[dropped - 1] * random.uniform(0.8, 1.2))

    async def _list(self) -> str:
        resp: Any = await self._core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self._node}", _preload_content=False,
            _request_timeout=aiohttp.ClientTimeout(total=60))
        body = await _json(resp)
        items = body.get("items") or []
        if len(items) > MAX_PODS:
            raise ValueError(f"more than {MAX_PODS} pods on node {self._node}")
        self._raw = {str(p["metadata"]["uid"]): p for p in items}
        await self._rebuild()
        self._synced_at = self._monotonic()
        return str((body.get("metadata") or {}).get("resourceVersion", ""))

    async def _watch(self) -> None:
        """One watch request from ``self._rv``, advancing it with every event and bookmark."""
        watch = Watch(return_type="object")
        try:
            async for event in watch.stream(
                    self._core.list_pod_for_all_namespaces,
                    field_selector=f"spec.nodeName={self._node}", resource_version=self._rv,
                    allow_watch_bookmarks=True, timeout_seconds=WATCH_TIMEOUT_S,
                    _request_timeout=aiohttp.ClientTimeout(sock_connect=10,
                                                           sock_read=self._inactivity_s)):
                if not isinstance(event, dict) or not isinstance(event.get("raw_object"), dict):
                    raise ValueError("the watch sent a line that is not a JSON event")
                kind, obj = event["type"], event["raw_object"]
                self._rv = watch.resource_version or self._rv
                if kind == "BOOKMARK":
                    continue
                uid = str(obj["metadata"]["uid"])
                if kind == "DELETED":
                    self._raw.pop(uid, None)
                elif kind in ("ADDED", "MODIFIED"):
                    self._raw[uid] = obj
                else:
                    continue
                self.events += 1
                await self._rebuild()
        except ApiException as exc:
            if exc.status == 410:
                raise Gone() from exc
            raise
        finally:
            await watch.close()

    async def _rebuild(self) -> None:
        pods = {}
        for raw in self._raw.values():
            meta = raw.get("metadata") or {}
            info = pod_info(raw, await self._workload(str(meta.get("namespace", "")),
                                                      direct_owner(meta)))
            pods[(info.namespace, info.name)] = info
        self._pods = pods

    async def _workload(self, ns: str, owner: OwnerRef | None) -> OwnerRef | None:
        """Follow ReplicaSet -> Deployment and Job -> CronJob (cached; one GET each)."""
        if owner is None or owner.kind not in ("ReplicaSet", "Job"):
            return owner
        key = (ns, owner.kind, owner.name)
        if key not in self._owners:
            group = "apps" if owner.kind == "ReplicaSet" else "batch"
            plural = "replicasets" if owner.kind == "ReplicaSet" else "jobs"
            try:
                resp = await self._api.call_api(
                    f"/apis/{group}/v1/namespaces/{{namespace}}/{plural}/{{name}}", "GET",
                    path_params={"namespace": ns, "name": owner.name},
                    header_params={"Accept": "application/json"},
                    auth_settings=["BearerToken"], _preload_content=False,
                    _request_timeout=10)
                meta = (await _json(resp)).get("metadata") or {}
                self._owners[key] = direct_owner(meta) or owner
            except ApiException as exc:
                if exc.status != 404:
                    raise
                self._owners[key] = owner  # gone: the pod's own owner is all there is
        return self._owners[key]


MAX_BODY_BYTES = 64 * 1024 * 1024


async def _json(resp: aiohttp.ClientResponse) -> dict[str, Any]:
    """The JSON body of a raw response; ApiException for a non-2xx status."""
    if not 200 <= resp.status < 300:
        resp.release()
        raise ApiException(status=resp.status, reason=resp.reason or "")
    try:
        body = await read_bounded(resp, MAX_BODY_BYTES)
    finally:
        resp.release()
    data = json.loads(body)
    if not isinstance(data, dict):
        raise ValueError("API answer is not a JSON object")
    return data


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        if exc.status == 403:
            return "forbidden (403): the agent's RBAC must allow list/watch pods"
        if exc.status == 401:
            return "unauthorized (401): check the service account token"
        return f"API error {exc.status} {exc.reason}"
    if isinstance(exc, TimeoutError):
        return "API server did not answer in time"
    return f"API server unreachable: {type(exc).__name__}: {str(exc)[:200]}"
