"""List+watch of one Kubernetes collection, kept current in memory.

Three layers, each owning one failure (after kopf): ``run`` reconnects with jittered
backoff; ``_sync`` lists, then watches from the list's resourceVersion and relists on
410 Gone; the watch itself uses bookmarks and an inactivity timeout (a silent server is a
dead one). A dropped watch resumes from the last resourceVersion seen (events and
bookmarks); only repeated drops fall back to a relist. Between failures the last known
items are kept; ``state`` says why they may be old.

Lists are read in pages (``limit``/``continue``, as client-go's pager does) up to
``max_items``; a continue token that expired while paging starts the list over. Every page
and every watch line is checked (kube/replies.py) before it is used: a reply the API's
contract does not allow is a ``BadReply`` that ``run`` logs and retries like any other
failure. ``ApiException`` and aiohttp errors do not leave this module.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

from gpuscale.common.bounded import BodyTooLarge, read_bounded
from gpuscale.common.errors import PeerError
from gpuscale.kube.errors import ApiError, BadReply
from gpuscale.kube.replies import (
    Status,
    load_json,
    parse_list_page,
    parse_status,
    parse_watch_line,
)

log = logging.getLogger(__name__)

WATCH_TIMEOUT_S = 300  # server-side watch length; then resume from the last resourceVersion
INACTIVITY_S = 90.0  # no byte (event or bookmark) for this long: reconnect
BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
MAX_ITEMS = 100_000
PAGE_SIZE = 500  # items a list page; client-go's pager (tools/pager) asks the same
LIST_RESTARTS = 3  # expired continue tokens in a row before the list counts as failed
MAX_BODY_BYTES = 64 * 1024 * 1024  # one list page
MAX_EVENT_BYTES = 16 * 1024 * 1024  # one watch line (etcd stores objects up to 1.5 MiB)
MAX_STATUS_BYTES = 64 * 1024  # the Status body of an error answer


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
                 max_items: int = MAX_ITEMS, page_size: int = PAGE_SIZE,
                 max_event_bytes: int = MAX_EVENT_BYTES,
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
        self._page_size = page_size
        self._max_event_bytes = max_event_bytes
        self.items: dict[str, Any] = {}
        self.synced_at: float | None = None
        self.error = ""
        self.events = 0
        self.relists = 0
        self.list_restarts = 0  # lists started over because a continue token expired
        self._rv = ""
        self._attempt = 0  # failures since the watch last delivered something
        self._gone = 0  # 410s since the watch last delivered something

    @property
    def resource_version(self) -> str:
        """Where a resumed watch starts: the version of the last list, event or bookmark
        seen ("" before the first list)."""
        return self._rv

    def state(self) -> tuple[bool, str]:
        """(connected, reason). Disconnected with items means "serving the last known"."""
        if self.error:
            return False, self.error
        return self.synced_at is not None, "ok" if self.synced_at else "not listed yet"

    async def run(self, ready: Callable[[], None] | None = None) -> None:
        while True:
            try:
                await self._sync(ready)
            except asyncio.CancelledError:
                raise
            except Gone:
                self.relists += 1
                self._gone += 1
                if self._gone == 1:  # the watch's history aged out: relist at once
                    continue
                await self._back_off("the resourceVersion expired again right after a "
                                     "relist (410)")
            except (ApiException, ApiError, aiohttp.ClientError, TimeoutError, OSError,
                    ValueError) as exc:
                await self._back_off(describe(exc, self.what))

    async def _back_off(self, reason: str) -> None:
        if reason != self.error:
            log.warning("%s: %s; retrying", self.what, reason)
        self.error = reason
        delay = self._backoff_s[min(self._attempt, len(self._backoff_s) - 1)]
        self._attempt += 1
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
        """List every page into ``items``; the snapshot's resourceVersion."""
        for _ in range(LIST_RESTARTS + 1):
            try:
                items, rv = await self._list_pages()
            except Gone:
                self.list_restarts += 1
                log.info("%s: the list's continue token expired; listing from the start",
                         self.what)
                continue
            self.items = items
            self.synced_at = self._monotonic()
            if self._on_change is not None:
                await self._on_change()
            return rv
        raise ApiError(f"the list's continue token expired {LIST_RESTARTS + 1} times in a "
                       f"row: the collection changes faster than it can be read", 410)

    async def _list_pages(self) -> tuple[dict[str, Any], str]:
        """Follow ``continue`` to the last page; Gone when a token expired on the way."""
        items: dict[str, Any] = {}
        token = ""
        for _ in range(self._max_items // self._page_size + 2):  # the server fills pages
            paging = {"_continue": token} if token else {}
            resp: Any = await self._list_fn(
                *self._args, **self._kwargs, **paging, limit=self._page_size,
                _preload_content=False, _request_timeout=aiohttp.ClientTimeout(total=60))
            try:
                page = parse_list_page(await api_json(resp, self.what))
            except ApiError as exc:
                if exc.status == 410 and token:
                    raise Gone(str(exc)) from None
                raise
            for uid, obj in page.items:
                items[uid] = self._keep(obj)
            if len(items) > self._max_items:
                raise ApiError(f"more than {self._max_items} items")
            if not page.continue_token:
                return items, page.resource_version
            token = page.continue_token
        raise BadReply(f"the list did not end after {self._max_items} items' worth of pages")

    async def _watch(self) -> None:
        """One watch request from the last resourceVersion, advancing it with every event
        and bookmark. Ends when the server ends the stream."""
        resp: Any = await self._list_fn(
            *self._args, **self._kwargs, watch=True, resource_version=self._rv,
            allow_watch_bookmarks=True, timeout_seconds=WATCH_TIMEOUT_S,
            _preload_content=False,
            _request_timeout=aiohttp.ClientTimeout(sock_connect=10,
                                                   sock_read=self._inactivity_s))
        try:
            try:
                await raise_for_status(resp, self.what)
            except ApiError as exc:
                if exc.status == 410:
                    raise Gone(str(exc)) from None
                raise
            async for line in read_lines(resp.content, self._max_event_bytes):
                event = parse_watch_line(line)
                if isinstance(event, Status):
                    if event.code == 410:
                        raise Gone(event.message)
                    raise ApiError(f"the watch failed: {event.code} {event.reason}: "
                                   f"{event.message}".rstrip(": "), event.code)
                self._attempt = self._gone = 0
                self._rv = event.resource_version or self._rv
                if event.type == "BOOKMARK":
                    continue
                if event.type == "DELETED":
                    self.items.pop(event.uid, None)
                else:
                    if event.uid not in self.items and len(self.items) >= self._max_items:
                        raise ApiError(f"more than {self._max_items} items")
                    self.items[event.uid] = self._keep(event.obj)
                self.events += 1
                if self._on_change is not None:
                    await self._on_change()
        finally:
            resp.close()


async def read_lines(content: aiohttp.StreamReader, limit: int) -> AsyncIterator[bytes]:
    """The non-blank lines of a stream, each at most ``limit`` bytes (BadReply past that).
    A stream that ends inside a line was cut: aiohttp.ClientPayloadError, as for any
    connection that broke mid-body."""
    buf = bytearray()
    while chunk := await content.readany():
        scan = len(buf)
        buf += chunk
        start = 0
        while (end := buf.find(b"\n", scan)) >= 0:
            if end - start > limit:
                raise BadReply(f"a watch event over {limit} bytes")
            line = bytes(buf[start:end])
            start = scan = end + 1
            if line.strip():
                yield line
        del buf[:start]
        if len(buf) > limit:
            raise BadReply(f"a watch event over {limit} bytes")
    if buf.strip():
        raise aiohttp.ClientPayloadError("the watch stream ended inside an event")


async def raise_for_status(resp: aiohttp.ClientResponse, what: str = "") -> None:
    """Nothing for a 2xx answer; else ApiError with the status and the Status message."""
    if 200 <= resp.status < 300:
        return
    try:
        status = parse_status(load_json(await read_bounded(resp, MAX_STATUS_BYTES), "status"))
    except (BadReply, BodyTooLarge, aiohttp.ClientError, TimeoutError):
        status = None
    finally:
        resp.release()
    raise ApiError(status_text(resp.status, status.message if status else resp.reason or "",
                               what), resp.status)


async def api_json(resp: aiohttp.ClientResponse, what: str = "") -> dict[str, Any]:
    """The JSON object of a raw response. ApiError for a non-2xx status (with the Status
    message), BadReply for a body that is not a JSON object."""
    try:
        await raise_for_status(resp, what)
        body = await read_bounded(resp, MAX_BODY_BYTES)
    finally:
        resp.release()
    data = load_json(body, "the API answer")
    if not isinstance(data, dict):
        raise BadReply(f"the API answer is not a JSON object but {type(data).__name__}")
    return data


def status_text(code: int, message: str, what: str = "") -> str:
    """A reason a person can act on, for an API answer with HTTP status ``code``."""
    detail = f": {message[:200]}" if message else ""
    if code == 403:
        return f"forbidden (403): RBAC must allow list/watch for the {what or 'resource'}" \
               f"{detail}"
    if code == 401:
        return "unauthorized (401): check the service account token"
    if code == 404:
        return "not found (404): is the resource (CRD) installed?"
    return f"API error {code}{detail}"


def describe(exc: BaseException, what: str = "") -> str:
    """A reason a person can act on, for an exception an API call raised."""
    if isinstance(exc, ApiError):
        return str(exc)
    if isinstance(exc, ApiException):
        return status_text(exc.status or 0, str(exc.reason or ""), what)
    if isinstance(exc, TimeoutError):
        return "API server did not answer in time"
    return f"API server unreachable: {type(exc).__name__}: {str(exc)[:200]}"
