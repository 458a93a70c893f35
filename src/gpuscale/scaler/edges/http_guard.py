"""aiohttp's low-level server with bounded connections, for every HTTP port the scaler
process serves (its /metrics, the metrics API).

aiohttp holds a request head in memory while it arrives, for as long as it takes, on as
many connections as peers open: its limits are per line (``max_line_size``,
``max_field_size``) and per count (``max_headers``, 128 by default), so one head may be
128 x 8 KB, and nothing bounds the connections. Measured on the scaler's /metrics: 100
connections sending 800 KB heads they never finish held +210 MiB (bench/bench_hostile.py).

Here a server holds at most ``max_connections`` connections (more are closed at once,
counted), closes a connection whose request head has been arriving for ``head_timeout_s``
(checked every half of it) or has passed ``max_head_bytes`` without being whole (a 431
line, then closed; counted): what its peers can make it hold is
``max_connections x max_head_bytes`` and aiohttp's own buffers. A request it cannot parse
is answered with its status and not logged (aiohttp logs each with a traceback).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web, web_protocol

HEAD_TIMEOUT_S = 10.0  # a request head still arriving after this: the connection is closed
_TOO_LARGE = (b"HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\n"
              b"Content-Length: 0\r\n\r\n")

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


class Bounds:
    """What the connections of one server share: the bounds and the counts."""

    def __init__(self, max_connections: int, max_head_bytes: int,
                 head_timeout_s: float = HEAD_TIMEOUT_S) -> None:
        self.max_connections = max_connections
        self.max_head_bytes = max_head_bytes
        self.head_timeout_s = head_timeout_s
        self.open = 0
        self.refused = 0  # connections closed at once: past max_connections
        self.timed_out = 0  # connections closed with a request head still arriving
        self.too_large = 0  # connections closed with a head past max_head_bytes


class BoundedConnection(web_protocol.RequestHandler):
    """One connection, counted against its server's ``Bounds``."""

    def __init__(self, manager: web.Server, bounds: Bounds, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._bounds = bounds
        self._counted = False
        self._partial_since: float | None = None
        self._partial_bytes = 0
        self._watch: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        bounds = self._bounds
        if bounds.open >= bounds.max_connections:
            bounds.refused += 1
            transport.close()
            return
        bounds.open += 1
        self._counted = True
        self._arm()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._counted:
            self._bounds.open -= 1
            self._counted = False
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self._counted:  # refused: closing
            return
        before = self._request_count
        super().data_received(data)
        if self._request_count > before:
            self._partial_since, self._partial_bytes = None, 0  # a whole request head
            return
        if self._partial_since is None and data:
            self._partial_since = asyncio.get_running_loop().time()
        self._partial_bytes += len(data)
        if self._partial_bytes > self._bounds.max_head_bytes and self.transport is not None:
            self._bounds.too_large += 1
            self.transport.write(_TOO_LARGE)
            self.transport.close()

    def handle_error(self, request: web.BaseRequest, status: int = 500,
                     exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        """A request this server cannot parse: its status in plain text, not logged
        (aiohttp logs each with a traceback: a peer could fill the log at will). A bug in
        our own handler (500) is aiohttp's as before: logged with its traceback."""
        if status == 500:
            return super().handle_error(request, status, exc, message)
        resp = web.Response(status=status, text=f"{status}: not a request this server "
                                                f"reads\n")
        resp.force_close()
        return resp

    def _arm(self) -> None:
        loop = asyncio.get_running_loop()  # (checked twice a timeout: closed within 1.5x)
        self._watch = loop.call_later(self._bounds.head_timeout_s / 2, self._check)

    def _check(self) -> None:
        self._watch = None
        since = self._partial_since
        loop = asyncio.get_running_loop()
        if since is not None and loop.time() - since >= self._bounds.head_timeout_s:
            self._bounds.timed_out += 1
            if self.transport is not None:
                self.transport.close()
            return
        self._arm()


class BoundedServer(web.Server):
    """aiohttp's low-level server whose connections obey ``bounds``."""

    def __init__(self, handler: Handler, bounds: Bounds, **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self.bounds = bounds

    def __call__(self) -> web_protocol.RequestHandler:
        return BoundedConnection(self, self.bounds, loop=self._loop, **self._kwargs)
