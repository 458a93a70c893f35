"""List+watch of one Kubernetes collection, kept current in memory.

Three layers, each owning one failure (after kopf): ``run`` reconnects with jittered
backoff; ``_sync`` lists, then watches from the list's resourceVersion and relists on
410 Gone; the watch itself uses bookmarks and an inactivity timeout (a silent server is a
dead one). A dropped watch resumes from the last resourceVersion seen (events and
bookmarks); only repeated drops fall back to a relist. Between failures the last known
items are kept; ``state`` says why they may be old. ``ApiException`` and aiohttp errors do
not leave this module.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.watch import Watch

from gpuscale.common.bounded import read_bounded
from gpuscale.common.errors import PeerError
from gpuscale.kube.errors import ApiError

log = logging.getLogger(__name__)

WATCH_TIMEOUT_S = 300  # server-side watch length; then resume from the last resourceVersion
INACTIVITY_S = 90.0  # no byte (event or bookmark) for this long: reconnect
BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
MAX_ITEMS = 100_000
MAX_BODY_BYTES = 64 * 1024 * 1024


class Gone(PeerError):
    """The resourceVersion is too old (410): relist."""


class ListWatch:
    """``items``: uid -> the object (its JSON, or what ``keep`` makes of it), for one
    collection (``list_fn`` and its arguments, e.g. CoreV1Api.list_pod_for_all_namespaces
    with a field selector)."""

    def __init__(self, list_fn: Callable[..., Awaitable[Any]], what: str,
                 list_args: tuple[Any, ...] = (),
                 list_kwargs: Mapping[str, Any] | None = None,
                 on_change: Callable[[], Awaitable[None]] | None = None,
                 monotonic: Callable[[], float] = time.monotonic,
                 inactivity_s: float = INACTIVITY_S,
                 backoff_s: tuple[float, ...] = BACKOFF_S,
                 max_items: int = MAX_ITEMS,
                 keep: Callable[[dict[str, Any]], Any] | None = None) -> None:
        """``keep``: what to hold of each object (default: all of its JSON); a watch of
        many objects keeps only the fields it reads."""
        self._keep = keep or (lambda obj: obj)
        self._list_fn = list_fn
        self.what = what
        self._args = list_args
        self._kwargs = dict(list_kwargs or {})
        self._on_change = on_change
        self._monotonic = monotonic
        self._inactivity_s = inactivity_s
        self._backoff_s = backoff_s
        self._max_items = max_items
        self.items: dict[str, Any] = {}
        self.synced_at: float | None = None
        self.error = ""
        self.events = 0
        self.relists = 0
        self._rv = ""

    def state(self) -> tuple[bool, str]:
        """(connected, reason). Disconnected with items means "serving the last known"."""
        if self.error:
            return False, self.error
        return self.synced_at is not None, "ok" if self.synced_at else "not listed yet"

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
            except (ApiException, ApiError, aiohttp.ClientError, TimeoutError, OSError,
                    ValueError) as exc:
                reason = describe(exc, self.what)
                if reason != self.error:
                    log.warning("%s: %s; retrying", self.what, reason)
                self.error = reason
                delay = self._backoff_s[min(attempt, len(self._backoff_s) - 1)]
                attempt += 1
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))

    async def _sync(self, ready: Callable[[], None] | None) -> None:
        self._rv = await self._list()
        if self.error:
            log.info("%s: connected again", self.what)
        self.error = ""
        if ready is not None:
            ready()
        dropped = 0
        while True:
            try:
                await self._watch()
                dropped = 0
            except (aiohttp.ClientError, TimeoutError) as exc:
                dropped += 1
                if dropped > len(self._backoff_s):
                    raise
                log.debug("%s dropped (%s); resuming from %s", self.what, exc, self._rv)
                await asyncio.sleep(self._backoff_s[dropped - 1] * random.uniform(0.8, 1.2))

    async def _list(self) -> str:
        resp: Any = await self._list_fn(*self._args, **self._kwargs, _preload_content=False,
                                        _request_timeout=aiohttp.ClientTimeout(total=60))
        body = await api_json(resp)
        items = body.get("items") or []
        if len(items) > self._max_items:
            raise ValueError(f"more than {self._max_items} items")
        self.items = {str(p["metadata"]["uid"]): self._keep(p) for p in items}
        self.synced_at = self._monotonic()
        if self._on_change is not None:
            await self._on_change()
        return str((body.get("metadata") or {}).get("resourceVersion", ""))

    async def _watch(self) -> None:
        """One watch request from the last resourceVersion, advancing it with every event
        and bookmark."""
        watch = Watch(return_type="object")
        try:
            async for event in watch.stream(
                    self._list_fn, *self._args, **self._kwargs, resource_version=self._rv,
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
                    self.items.pop(uid, None)
                elif kind in ("ADDED", "MODIFIED"):
                    if uid not in self.items and len(self.items) >= self._max_items:
                        raise ValueError(f"more than {self._max_items} items")
                    self.items[uid] = self._keep(obj)
                else:
                    continue
                self.events += 1
                if self._on_change is not None:
                    await self._on_change()
        except ApiException as exc:
            if exc.status == 410:
                raise Gone() from exc
            raise
        finally:
            await watch.close()


async def api_json(resp: aiohttp.ClientResponse) -> dict[str, Any]:
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


def describe(exc: BaseException, what: str = "") -> str:
    """A reason a person can act on, for an exception an API call raised."""
    if isinstance(exc, ApiError):
        return str(exc)
    if isinstance(exc, ApiException):
        if exc.status == 403:
            return f"forbidden (403): RBAC must allow list/watch for the {what or 'resource'}"
        if exc.status == 401:
            return "unauthorized (401): check the service account token"
        if exc.status == 404:
            return "not found (404): is the resource (CRD) installed?"
        return f"API error {exc.status} {exc.reason}"
    if isinstance(exc, TimeoutError):
        return "API server did not answer in time"
    return f"API server unreachable: {type(exc).__name__}: {str(exc)[:200]}"
