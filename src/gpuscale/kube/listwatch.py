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
failure. The requests are plain GETs on lightkube's httpx2 client (kube/connect.py), read
as streams with a bound; httpx2 errors do not leave this module.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import httpx2

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


LIST_TIMEOUT_S = 60.0  # one list page, request to last byte (a big page is slow to start)
CONNECT_TIMEOUT_S = 10.0
JSON = {"Accept": "application/json"}


class Gone(PeerError):
    """The resourceVersion is too old (410): relist."""


class Cut(PeerError):
    """The connection broke inside a body (a watch line left unfinished): resume."""


# What a request can fail with, besides ApiError: the connection (httpx2's transport
# errors, timeouts, a cut stream) or a body that is no HTTP (httpx2 raises those as
# its own errors too). Whatever else escapes is a bug, and crashes loudly.
DROPPED: tuple[type[Exception], ...] = (httpx2.TransportError, httpx2.DecodingError, Cut,
                                        TimeoutError)
FAILED: tuple[type[Exception], ...] = (ApiError, httpx2.HTTPError, *DROPPED, OSError,
                                       ValueError)


class ListWatch:
    """``items``: uid -> the object (its JSON, or what ``keep`` makes of it), for one
    collection: ``path`` (``/api/v1/pods``) on ``http`` (a client with the base URL and
    credentials), with ``params`` (the selectors) on every list and watch request."""

    def __init__(self, http: httpx2.AsyncClient, path: str, what: str,
                 params: Mapping[str, str] | None = None,
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
        self._http = http
        self._path = path
        self.what = what
        self._params = dict(params or {})
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
            except FAILED as exc:
                await self._back_off(describe(exc))

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
            except DROPPED as exc:
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
            params = {**self._params, "limit": str(self._page_size)}
            if token:
                params["continue"] = token
            try:
                async with asyncio.timeout(LIST_TIMEOUT_S):
                    resp = await self._http.send(self._http.build_request(
                        "GET", self._path, params=params, headers=JSON,
                        timeout=httpx2.Timeout(CONNECT_TIMEOUT_S, read=LIST_TIMEOUT_S)),
                        stream=True)
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
        params = {**self._params, "watch": "true", "resourceVersion": self._rv,
                  "allowWatchBookmarks": "true", "timeoutSeconds": str(WATCH_TIMEOUT_S)}
        timeout = httpx2.Timeout(CONNECT_TIMEOUT_S, read=self._inactivity_s)
        resp = await self._http.send(self._http.build_request(
            "GET", self._path, params=params, headers=JSON, timeout=timeout), stream=True)
        try:
            try:
                await raise_for_status(resp, self.what)
            except ApiError as exc:
                if exc.status == 410:
                    raise Gone(str(exc)) from None
                raise
            async for line in read_lines(resp.aiter_bytes(), self._max_event_bytes):
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
            await resp.aclose()


async def read_lines(chunks: AsyncIterable[bytes], limit: int) -> AsyncIterator[bytes]:
    """The non-blank lines of a stream, each at most ``limit`` bytes (BadReply past that).
    A stream that ends inside a line was cut: Cut, as for any connection that broke
    mid-body."""
    buf = bytearray()
    async for chunk in chunks:
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
        raise Cut("the watch stream ended inside an event")


async def raise_for_status(resp: httpx2.Response, what: str = "") -> None:
    """Nothing for a 2xx answer; else ApiError with the status and the Status message.
    Closes ``resp`` when it raises."""
    if 200 <= resp.status_code < 300:
        return
    try:
        body = await read_bounded(resp, MAX_STATUS_BYTES)
        status = parse_status(load_json(body, "status"))
    except (BadReply, BodyTooLarge, httpx2.HTTPError, TimeoutError):
        status = None
    finally:
        await resp.aclose()
    raise ApiError(status_text(resp.status_code,
                               status.message if status else resp.reason_phrase, what),
                   resp.status_code)


async def api_json(resp: httpx2.Response, what: str = "") -> dict[str, Any]:
    """The JSON object of a streamed response (closed on return). ApiError for a non-2xx
    status (with the Status message), BadReply for a body that is not a JSON object,
    BodyTooLarge past MAX_BODY_BYTES."""
    try:
        await raise_for_status(resp, what)
        body = await read_bounded(resp, MAX_BODY_BYTES)
    finally:
        await resp.aclose()
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
    if code == 404:  # an object the API names as missing, or a whole resource type
        if message and "could not find the requested resource" not in message:
            return f"not found (404){detail}"
        return f"not found (404){detail}: is the resource (CRD) installed?"
    return f"API error {code}{detail}"


def describe(exc: BaseException) -> str:
    """A reason a person can act on, for an exception an API call raised."""
    if isinstance(exc, ApiError):
        return str(exc)
    if isinstance(exc, (TimeoutError, httpx2.TimeoutException)):
        return "API server did not answer in time"
    return f"API server unreachable: {type(exc).__name__}: {str(exc)[:200]}"
