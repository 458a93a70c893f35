"""The agent's HTTP endpoints: /metrics, /healthz, /readyz.

Handlers only render what the sampler already holds: no NVML call, no lock. /healthz
answers while the process runs; /readyz is 200 only when a sample succeeded and the latest
one is fresh, and its body says why not otherwise. Other paths are 404, other methods than
GET and HEAD 405.

Served by the standard library's HTTP server (wsgiref, which prometheus_client loads and
serves its own ``start_http_server`` with anyway) in threads of its own, not on the event
loop: the agent carries no web framework (aiohttp was ~9 MiB of its RSS), and rendering a
large /metrics (~10 ms of CPU on a node of 56 MIG instances) never holds up a tick. One
thread per connection, at most ``MAX_CONNECTIONS`` at once (more are closed unanswered, so
a flood of connections cannot grow the agent); a connection that has not sent its whole
request within ``REQUEST_TIMEOUT_S`` is closed. Request lines and header lines over 64 KiB
are refused (414, 431) by the server; we read no request body beyond ``MAX_DRAIN_BYTES``
(drained only so that the refusal reaches the client before the connection closes).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import socketserver
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 16  # Prometheus, the kubelet's probes, a person with curl
REQUEST_TIMEOUT_S = 10.0
MAX_DRAIN_BYTES = 64 * 1024
PATHS = ("/metrics", "/healthz", "/readyz")


def make_app(registry: CollectorRegistry,
             readiness: Callable[[], tuple[bool, str]]) -> WSGIApplication:
    """The three endpoints as a WSGI application."""

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path, method = environ.get("PATH_INFO", ""), environ["REQUEST_METHOD"]
        extra: list[tuple[str, str]] = []
        if path not in PATHS:
            status, body, kind = "404 Not Found", b"not found\n", "text/plain"
        elif method not in ("GET", "HEAD"):
            status, body, kind = "405 Method Not Allowed", b"GET or HEAD only\n", "text/plain"
            extra.append(("Allow", "GET, HEAD"))
        elif path == "/metrics":
            status, body, kind = "200 OK", generate_latest(registry), CONTENT_TYPE_LATEST
        elif path == "/healthz":
            status, body, kind = "200 OK", b"ok\n", "text/plain"
        else:
            ok, why = readiness()
            status = "200 OK" if ok else "503 Service Unavailable"
            body, kind = (why + "\n").encode(), "text/plain"
        _drain(environ)
        start_response(status, [("Content-Type", kind), ("Content-Length", str(len(body))),
                                *extra])
        return [b""] if method == "HEAD" else [body]

    return app


def _drain(environ: WSGIEnvironment) -> None:
    """Read (a bounded part of) a request body we do not want: closing a connection with
    unread data makes the kernel reset it, and the client may lose our answer."""
    try:
        left = min(int(environ.get("CONTENT_LENGTH") or 0), MAX_DRAIN_BYTES)
    except ValueError:
        return
    stream = environ["wsgi.input"]
    while left > 0:
        chunk = stream.read(min(left, 16 * 1024))
        if not chunk:
            return
        left -= len(chunk)


class _Handler(WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT_S  # on the connection's socket: each read and write

    def log_message(self, format: str, *args: Any) -> None:
        pass  # no access log


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a slow client never holds up the agent's exit
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], family: socket.AddressFamily,
                 app: WSGIApplication) -> None:
        self.address_family = family
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(address, _Handler)
        self.set_app(app)

    def server_bind(self) -> None:
        # HTTPServer.server_bind would look the address up in DNS (getfqdn) for a server
        # name nobody reads here: a stall at start where DNS is slow.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), \
            int(self.server_address[1])
        self.setup_environ()

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)  # over the limit: closed unanswered
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that went away or was too slow: its problem, not the agent's.
        log.debug("HTTP connection from %s ended badly", client_address, exc_info=True)


class HttpServer:
    """The endpoints served from threads; ``close()`` stops accepting and returns once the
    serving loop has ended (connections still open are left to their timeout)."""

    def __init__(self, app: WSGIApplication, host: str, port: int,
                 family: socket.AddressFamily) -> None:
        self._server = _Server((host, port), family, app)
        self.port = int(self._server.server_port)
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.5}, name="http",
                                        daemon=True)
        self._thread.start()

    async def close(self) -> None:
        await asyncio.to_thread(self._server.shutdown)
        self._server.server_close()


async def start_http(app: WSGIApplication, host: str, port: int) -> HttpServer:
    """Start serving on ``host:port`` (0 picks a port: ``HttpServer.port``). OSError when the
    address cannot be bound."""
    infos = await asyncio.get_running_loop().getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, address = infos[0]
    return HttpServer(app, str(address[0]), port, family)
