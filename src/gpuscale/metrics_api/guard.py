"""The metrics API's HTTP layer against peers that are not the aggregator: whoever can
reach port 6443 may send anything before any certificate is checked.

aiohttp answers a request it cannot parse (a request line longer than ``max_line_size``,
a header longer than ``max_field_size``, bytes that are not HTTP) itself, in plain text,
and logs each with a 9-line traceback: a peer could fill the scaler's log at will, and a
client gets no Kubernetes ``Status``. Here such a request gets a ``Status`` (431 for a
header too large, 400 for anything else) and at most one log line per peer a minute
(counted: ``rejected``). And the server holds at most ``max_connections`` connections
that finished their TLS handshake (more are closed at once, counted; a handshake itself
has asyncio's 60 s), and closes a connection whose request has been arriving for
``head_timeout_s`` (checked every half of it) or past ``max_head_bytes`` without being
whole (scaler.edges.http_guard): a slow-loris holds no slot longer, and no head more
than 64 KiB (aiohttp alone allows 128 headers of 8 KB each).
A bug in our own handler (500) is aiohttp's as before: logged with its traceback.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web, web_protocol
from aiohttp.http_exceptions import LineTooLong

from gpuscale.metrics_api.shapes import status as status_body
from gpuscale.scaler.edges.http_guard import (
    HEAD_TIMEOUT_S,
    BoundedConnection,
    BoundedServer,
    Bounds,
)

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 512  # the aggregator keeps a few; a cluster's HPAs all come through it
# A request head: the request line (a query of at most MAX_QUERY, 8 KiB, and the path) and
# the aggregator's headers (its identity headers, a few KiB); past it: 431 and closed.
MAX_HEAD_BYTES = 64 * 1024
LOG_EVERY_S = 60.0  # one line per peer in this long about its malformed requests
_PEERS_REMEMBERED = 10_000

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


class Guard(Bounds):
    """What the connections of one server share: the bounds and counts
    (scaler.edges.http_guard), and whom it logged when."""

    def __init__(self, max_connections: int = MAX_CONNECTIONS,
                 head_timeout_s: float = HEAD_TIMEOUT_S, log_every_s: float = LOG_EVERY_S,
                 monotonic: Callable[[], float] = time.monotonic,
                 max_head_bytes: int = MAX_HEAD_BYTES) -> None:
        super().__init__(max_connections, max_head_bytes, head_timeout_s)
        self._log_every_s = log_every_s
        self._monotonic = monotonic
        self.rejected = 0  # requests that were not HTTP this server reads
        self._logged: dict[str, float] = {}  # peer -> when it was last logged

    def note(self, peer: str, what: str) -> None:
        """Count a malformed request; log it unless this peer was logged within
        ``log_every_s`` (one line, no traceback)."""
        self.rejected += 1
        now = self._monotonic()
        last = self._logged.get(peer)
        if last is not None and now - last < self._log_every_s:
            return
        if len(self._logged) >= _PEERS_REMEMBERED:
            self._logged.clear()
        self._logged[peer] = now
        log.warning("metrics API: a malformed request from %s (%s); its next ones within "
                    "%.0fs are not logged (%d so far from everyone)", peer, what[:200],
                    self._log_every_s, self.rejected)


class _Connection(BoundedConnection):
    def __init__(self, manager: web.Server, guard: Guard, field_size: int,
                 **kwargs: Any) -> None:
        super().__init__(manager, guard, **kwargs)
        self._guard = guard
        self._field_size = field_size  # the header limit (to tell a header from the line)

    def handle_error(self, request: web.BaseRequest, status: int = 500,
                     exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if status == 500:  # our own handler failed: aiohttp's answer and traceback
            return super().handle_error(request, status, exc, message)
        header = isinstance(exc, LineTooLong) and \
            f"more than {self._field_size} bytes" in str(exc)
        code = 431 if header else 400
        why = ("a request header is larger than this server reads" if header else
               "the request line is larger than this server reads"
               if isinstance(exc, LineTooLong) else
               f"not an HTTP request this server reads ({type(exc).__name__})")
        self._guard.note(request.remote or "unknown", why)
        resp = web.json_response(status_body(code, why), status=code)
        resp.force_close()
        return resp


class GuardedServer(BoundedServer):
    """aiohttp's low-level server whose connections answer malformed requests with a
    Kubernetes ``Status``, log them sparingly, and obey ``guard``'s bounds."""

    def __init__(self, handler: Handler, guard: Guard, max_field_size: int,
                 **kwargs: Any) -> None:
        super().__init__(handler, guard, max_field_size=max_field_size, **kwargs)
        self.guard = guard
        self._max_field_size = max_field_size

    def __call__(self) -> web_protocol.RequestHandler:
        return _Connection(self, self.guard, self._max_field_size, loop=self._loop,
                           **self._kwargs)
