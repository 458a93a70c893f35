"""The relay's front (``scaler.edges.relay``): the child process that holds KEDA's port -
ExternalScaler, Inspect, health and reflection, TLS as configured - and relays each call's
bytes to the fleet process over the socket it was given. It computes nothing. When the
fleet process cannot be reached it answers UNAVAILABLE (KEDA keeps its fallback) and exits.
Run as ``python -m gpuscale.scaler.edges.relay_front`` by ``relay_supervisor.Front``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import socket
import sys
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from gpuscale.common.grpc_bind import bind
from gpuscale.scaler.edges.relay import (
    CANCEL,
    END,
    HEADER,
    ID_SPACE,
    MAX_REPLY,
    MSG,
    PING,
    PONG,
    REQ,
    SERVICES,
    STOP_GRACE_S,
    FrontStats,
    _Inbox,
    frame,
    methods,
    parse_status,
    read_frame,
    request,
    status,
)

log = logging.getLogger(__name__)
_GONE = "gpuscale scaler: the fleet process is not reachable from its gRPC front"


class RelayFront:
    """The front's one connection to the fleet process, and the calls riding on it: a
    unary call waits on a future (its reply and status come in one piece), a stream on a
    queue of frames."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer
        self._last_id = 0
        self._unary: dict[int, tuple[asyncio.Future[tuple[bytes | None, bytes]],
                                     list[bytes]]] = {}
        self._streams: dict[int, _Inbox] = {}
        self.closed = asyncio.Event()

    async def pump(self) -> None:
        """Deliver the fleet process's frames to their calls until it goes away; then every
        call still open ends UNAVAILABLE."""
        try:
            while True:
                kind, call, payload = await read_frame(self._reader, MAX_REPLY + HEADER.size)
                if kind == PING:  # (its number is the fleet process's, not a call id)
                    self._writer.write(frame(PONG, call, FrontStats.now().pack()))
                elif (waiting := self._unary.get(call)) is not None:
                    future, replies = waiting
                    if kind == MSG:
                        replies.append(payload)
                    elif kind == END and not future.done():
                        future.set_result((replies[-1] if replies else None, payload))
                elif (inbox := self._streams.get(call)) is not None:
                    inbox.put(kind, payload)
        except (asyncio.IncompleteReadError, ConnectionError, ValueError) as exc:
            log.error("relay: %s (%s)", _GONE, exc or type(exc).__name__)
        finally:
            self.closed.set()
            gone = status(grpc.StatusCode.UNAVAILABLE, _GONE)
            for future, _ in self._unary.values():
                if not future.done():
                    future.set_result((None, gone))
            for inbox in self._streams.values():
                inbox.put(END, gone)
            self._writer.close()

    def _next_id(self) -> int:
        """A call id no open call holds (ids wrap after 2**32 - 1; 0 is never used)."""
        while True:
            self._last_id = self._last_id % (ID_SPACE - 1) + 1
            if self._last_id not in self._unary and self._last_id not in self._streams:
                return self._last_id

    def _send(self, method: str, call: int, body: bytes,
              context: grpc.aio.ServicerContext[Any, Any]) -> None:
        self._writer.write(frame(REQ, call, request(method, context.peer() or "", body)))

    def _cancel(self, call: int) -> None:
        if not self.closed.is_set():
            self._writer.write(frame(CANCEL, call))

    async def unary(self, method: str, body: bytes,
                    context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        """One unary call: the fleet process's reply, or its status as the call's."""
        if self.closed.is_set():
            await context.abort(grpc.StatusCode.UNAVAILABLE, _GONE)
        call = self._next_id()
        future: asyncio.Future[tuple[bytes | None, bytes]] = \
            asyncio.get_running_loop().create_future()
        self._unary[call] = (future, [])
        try:
            self._send(method, call, body, context)
            reply, end = await future
        except asyncio.CancelledError:
            self._cancel(call)
            raise
        finally:
            del self._unary[call]
        code, details = parse_status(end)
        if code is grpc.StatusCode.OK and reply is None:  # never an empty answer as OK
            code, details = grpc.StatusCode.INTERNAL, ("relay: the fleet process ended the "
                                                       "call without a reply")
        if code is not grpc.StatusCode.OK or reply is None:
            await context.abort(code, details)
            raise AssertionError("unreachable")  # abort raises
        return reply

    async def stream(self, method: str, body: bytes,
                     context: grpc.aio.ServicerContext[Any, Any]
                     ) -> AsyncGenerator[bytes, None]:
        """One server stream: the fleet process's messages; its final status applied."""
        if self.closed.is_set():
            await context.abort(grpc.StatusCode.UNAVAILABLE, _GONE)
        call = self._next_id()
        inbox = self._streams[call] = _Inbox()
        done = False
        try:
            self._send(method, call, body, context)
            while True:
                kind, payload = await inbox.get()
                if kind == MSG:
                    yield payload
                elif kind == END:
                    done = True
                    code, details = parse_status(payload)
                    if code is not grpc.StatusCode.OK:
                        await context.abort(code, details)
                    return
        finally:
            del self._streams[call]
            if not done:
                self._cancel(call)

    def handler(self) -> grpc.GenericRpcHandler:
        """Every relayed method, bytes in and bytes out (one handler per method, made
        once)."""
        front = self

        def unary(method: str) -> grpc.RpcMethodHandler[bytes, bytes]:
            async def call(body: bytes, context: Any) -> bytes:
                return await front.unary(method, body, context)
            return grpc.unary_unary_rpc_method_handler(call)

        def stream(method: str) -> grpc.RpcMethodHandler[bytes, bytes]:
            async def call(body: bytes, context: Any) -> AsyncIterator[bytes]:
                # closed at once when the client goes (the CANCEL then leaves at once)
                async with contextlib.aclosing(front.stream(method, body, context)) as got:
                    async for reply in got:
                        yield reply
            return grpc.unary_stream_rpc_method_handler(call)

        handlers = {method: stream(method) if streaming else unary(method)
                    for method, streaming in methods().items()}

        class _Relay(grpc.GenericRpcHandler):
            def service(self, details: grpc.HandlerCallDetails) -> Any:
                return handlers.get(details.method)

        return _Relay()



async def run_front(fd: int, address: str,
                    credentials: grpc.ServerCredentials | None,
                    options: list[tuple[str, int]],
                    on_listening: Callable[[int], None]) -> None:
    """The front: connect to the fleet process, serve KEDA's port until the fleet process
    goes away or SIGTERM asks for a graceful stop."""
    import signal

    from gpuscale.scaler.edges.keda import SERVICE, enable_reflection

    reader, writer = await asyncio.open_unix_connection(sock=socket.socket(fileno=fd))
    front = RelayFront(reader, writer)
    server = grpc.aio.server(options=options)
    server.add_generic_rpc_handlers((front.handler(),))
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    enable_reflection(server, (*(s.full_name for s in SERVICES),
                               health_pb2.DESCRIPTOR.services_by_name["Health"].full_name))
    port = bind(server, address, credentials)
    await server.start()
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    await health.set(SERVICE, health_pb2.HealthCheckResponse.SERVING)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    gc.collect()
    gc.freeze()  # what start-up made stays out of the collector's way
    on_listening(port)
    pump = loop.create_task(front.pump())
    waits = [loop.create_task(front.closed.wait()), loop.create_task(stop.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
        await health.enter_graceful_shutdown()
        # New calls are refused from here; those in flight (streams included) go on until
        # the fleet process ends them, which it does as it stops.
        await server.stop(STOP_GRACE_S)
        pump.cancel()


def main(argv: list[str] | None = None) -> int:
    """``python -m gpuscale.scaler.edges.relay_front``: started by the fleet process, never by a
    person (its arguments are the fleet process's own, already checked). Prints
    "listening PORT" once it serves, or "cannot listen: WHY" and exits 1."""
    ap = argparse.ArgumentParser(prog="gpuscale-front")
    ap.add_argument("--fd", type=int, required=True)
    ap.add_argument("--address", required=True)
    ap.add_argument("--options", default="{}")
    ap.add_argument("--tls", nargs=3, type=Path, metavar=("CERT", "KEY", "CA"))
    args = ap.parse_args(argv)
    import json

    from gpuscale.stream.tls import TlsFiles, server_credentials

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s front: %(message)s")
    options = [(k, int(v)) for k, v in json.loads(args.options).items()]

    def listening(port: int) -> None:
        print(f"listening {port}", flush=True)

    try:
        credentials = server_credentials(TlsFiles(*args.tls)) if args.tls else None
        asyncio.run(run_front(args.fd, args.address, credentials, options, listening))
    except OSError as exc:
        print(f"cannot listen: {exc}", flush=True)
        return 1
    return 0



if __name__ == "__main__":
    sys.exit(main())
