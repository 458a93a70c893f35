"""KEDA's gRPC port in a process of its own (``gpuscale scaler --answer-process``).

Every unary call a grpc.aio server answers leaves five objects in a reference cycle that
only Python's cyclic collector frees (grpcio 1.85; ``bench/grpc_garbage.py``). In the
scaler those collections also walk the fleet's newest records, so at KEDA's 3,000 calls/s
each one held the event loop 40-90 ms, and every call, push round and agent update waited
behind it (BENCHMARKS.md, issue 26). Here the scaler (the *fleet process*) keeps the
fleet view, the answers, the planner and the history, and serves them over a socket pair
(nothing on the file system) in a framing of its own (no gRPC, so no per-call cycle
there); a small child process (the *front*) holds KEDA's port - ExternalScaler, Inspect,
health and reflection, TLS as configured - and relays each call's bytes. Its heap is
gRPC's objects and little else, so its collections are short; the fleet process's young
generation no longer fills with gRPC's garbage.

The front computes nothing: each call's request bytes, method and peer go to the fleet
process, which runs the very servicer methods the in-process server runs (one answer
function), and its replies and final status (code and message) come back as they are.
A call the client cancels is cancelled in the fleet process (a stream's place in the
stream book is released). When the fleet process cannot be reached, the front answers
UNAVAILABLE (KEDA keeps its fallback) and exits: it is the fleet process's child and
lives only with it. The fleet process, in turn, ends when its front ends.

Frames on the socket: a 9-byte header (payload length, kind, call id) and the payload:
REQ (front -> fleet: method, peer, request bytes), MSG (a reply message), END (status code
and message: the call is over), CANCEL (front -> fleet), PING (fleet -> front, every
``HEARTBEAT_S``) and PONG (front -> fleet: the front's CPU seconds, resident memory and
collections, ``FrontStats``). A request frame longer than ``MAX_FRAME`` ends the
connection; a reply past ``MAX_REPLY`` ends its call RESOURCE_EXHAUSTED and nothing else.
Call ids wrap around, skipping those in use.

**A wedged front** (alive, its event loop stuck) would hold KEDA's port and answer
nothing, and the scaler's liveness probe (its own HTTP port) would not see it: the fleet
process pings the front, and a front that has not answered for ``WEDGED_S`` is killed and
the scaler ends (Kubernetes restarts the pod; KEDA holds its fallback meanwhile). Its PONGs
put the front's CPU, memory and collections on the scaler's ``/metrics``
(``gpuscale_front_*``), beside the fleet process's own.

**A stream's messages are whole states** (KEDA's activity, its metric specs): one the
client has not taken yet is replaced by a newer one (``_Inbox``), so a client that stops
reading holds one message in the front, never a backlog.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import math
import resource
import socket
import struct
import sys
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from gpuscale.common.errors import Overloaded
from gpuscale.common.grpc_bind import bind
from gpuscale.proto import externalscaler_pb2, inspect_pb2

log = logging.getLogger(__name__)

HEADER = struct.Struct("!IBI")  # payload length, kind, call id
REQ, MSG, END, CANCEL, PING, PONG = 1, 2, 3, 4, 5, 6
HEARTBEAT_S = 5.0  # the fleet process pings its front this often
WEDGED_S = 30.0  # a front silent this long is stuck: killed, and the scaler ends
MAX_FRAME = 4 * 1024 * 1024  # a request (the scaler's own gRPC receive limit is 1 MiB)
MAX_REPLY = 256 * 1024 * 1024  # a reply message (gpuscale's own clients accept this much)
STOP_GRACE_S = 5.0  # calls in flight when the scaler stops (as the in-process server)
ID_SPACE = 1 << 32  # call ids wrap around (the header's 32 bits); ids in use are skipped
SERVICES = (externalscaler_pb2.DESCRIPTOR.services_by_name["ExternalScaler"],
            inspect_pb2.DESCRIPTOR.services_by_name["Inspect"])
_CODES = {code.value[0]: code for code in grpc.StatusCode}
_GONE = "gpuscale scaler: the fleet process is not reachable from its gRPC front"


#: The server streams relayed; each message is a whole state (an activity, the metric
#: specs), so the front keeps only the newest one a client has not taken (``_Inbox``). A
#: stream of changes would lose them that way: it must not be added here unchanged.
WHOLE_STATE_STREAMS = frozenset({"/externalscaler.ExternalScaler/StreamIsActive",
                                 "/externalscaler.ExternalScaler/StreamMetricSpec"})


def methods() -> dict[str, bool]:
    """Full method path -> whether the server streams, for every relayed method."""
    found = {f"/{s.full_name}/{m.name}": m.server_streaming
             for s in SERVICES for m in s.methods}
    streams = {name for name, streaming in found.items() if streaming}
    if streams != WHOLE_STATE_STREAMS:
        raise AssertionError(f"relayed streams {sorted(streams)}: the front keeps only the "
                             "newest message of a whole-state stream (WHOLE_STATE_STREAMS)")
    return found


@dataclass(frozen=True, slots=True)
class FrontStats:
    """What the front says of itself in each PONG."""

    cpu_s: float  # user + system CPU seconds since it started
    rss_bytes: int  # resident memory now
    collections: tuple[int, int, int]  # the cyclic collector's runs, per generation

    FORMAT = struct.Struct("!dQIII")

    def pack(self) -> bytes:
        return self.FORMAT.pack(self.cpu_s, self.rss_bytes, *self.collections)

    @classmethod
    def unpack(cls, payload: bytes) -> FrontStats:
        """ValueError for a payload that is not one."""
        if len(payload) != cls.FORMAT.size:
            raise ValueError(f"a PONG of {len(payload)} bytes ({cls.FORMAT.size} expected)")
        cpu, rss, g0, g1, g2 = cls.FORMAT.unpack(payload)
        if not (math.isfinite(cpu) and cpu >= 0):
            raise ValueError(f"a PONG with {cpu!r} CPU seconds")
        return cls(cpu, rss, (g0, g1, g2))

    @classmethod
    def now(cls) -> FrontStats:
        """This process's own figures."""
        usage = resource.getrusage(resource.RUSAGE_SELF)
        try:  # resident pages now (Linux); the peak where /proc is not there
            with open("/proc/self/statm", "rb") as statm:
                rss = int(statm.read().split()[1]) * resource.getpagesize()
        except (OSError, IndexError, ValueError):
            rss = usage.ru_maxrss * 1024
        runs = [g["collections"] for g in gc.get_stats()][:3]
        return cls(usage.ru_utime + usage.ru_stime, rss,
                   (runs[0], runs[1], runs[2]) if len(runs) == 3 else (0, 0, 0))


def frame(kind: int, call: int, payload: bytes = b"") -> bytes:
    return HEADER.pack(len(payload), kind, call) + payload


def _strings(*parts: str) -> bytes:
    out = b""
    for part in parts:
        raw = part.encode()
        out += struct.pack("!H", len(raw)) + raw
    return out


def request(method: str, peer: str, body: bytes) -> bytes:
    return _strings(method, peer[:1000]) + body


def parse_request(payload: bytes) -> tuple[str, str, bytes]:
    """(method, peer, body). ValueError for a payload that is not one."""
    parts, at = [], 0
    for _ in range(2):
        if at + 2 > len(payload):
            raise ValueError("truncated request frame")
        (n,) = struct.unpack_from("!H", payload, at)
        if at + 2 + n > len(payload):
            raise ValueError("truncated request frame")
        parts.append(payload[at + 2:at + 2 + n].decode())
        at += 2 + n
    return parts[0], parts[1], payload[at:]


def status(code: grpc.StatusCode, details: str) -> bytes:
    return struct.pack("!B", code.value[0]) + details.encode(errors="replace")


def parse_status(payload: bytes) -> tuple[grpc.StatusCode, str]:
    if not payload:
        return grpc.StatusCode.INTERNAL, "an empty status frame from the fleet process"
    code = _CODES.get(payload[0], grpc.StatusCode.UNKNOWN)
    return code, payload[1:].decode(errors="replace")


async def read_frame(reader: asyncio.StreamReader,
                     limit: int = MAX_FRAME) -> tuple[int, int, bytes]:
    """(kind, call id, payload). IncompleteReadError at the end; ValueError for a frame
    past ``limit``."""
    size, kind, call = HEADER.unpack(await reader.readexactly(HEADER.size))
    if size > limit:
        raise ValueError(f"a frame of {size} bytes (at most {limit})")
    return kind, call, await reader.readexactly(size) if size else b""


# -- the fleet process's side ----------------------------------------------------------------


class RelayedContext:
    """What the scaler's servicers use of grpc.aio.ServicerContext: abort, code, peer."""

    def __init__(self, peer: str) -> None:
        self._peer = peer
        self._code: grpc.StatusCode | None = None
        self.details = ""

    def peer(self) -> str:
        return self._peer

    def code(self) -> grpc.StatusCode | None:
        return self._code

    async def abort(self, code: grpc.StatusCode, details: str = "",
                    trailing_metadata: Any = ()) -> None:
        self._code, self.details = code, details
        raise grpc.aio.AbortError()  # what grpc.aio's own abort raises


@dataclass(frozen=True, slots=True)
class _Method:
    handler: Any  # grpc.RpcMethodHandler
    streaming: bool


class _Collector:
    """Stands in for a grpc server while the generated ``add_*_to_server`` functions
    register their handlers, to keep them by method path."""

    def __init__(self) -> None:
        self.found: dict[str, Any] = {}

    def add_generic_rpc_handlers(self, handlers: Iterable[Any]) -> None:
        pass  # the same handlers come through add_registered_method_handlers

    def add_registered_method_handlers(self, service: str,
                                       handlers: Mapping[str, Any]) -> None:
        for name, handler in handlers.items():
            self.found[f"/{service}/{name}"] = handler


class RelayBackend:
    """Runs relayed calls against the servicers registered by ``registrations`` (each a
    generated ``add_*_to_server``-like function taking a server)."""

    def __init__(self, registrations: Iterable[Callable[[Any], None]]) -> None:
        collector = _Collector()
        for register in registrations:
            register(collector)
        self._methods = {path: _Method(handler, handler.unary_stream is not None)
                         for path, handler in collector.found.items()
                         if handler.unary_unary is not None or handler.unary_stream is not None}
        self._writers: set[asyncio.StreamWriter] = set()
        self.stats: FrontStats | None = None  # the front's, from its latest PONG
        self.answered = time.monotonic()  # when the front last answered a PING
        self.answered_seq = 0  # and which

    @property
    def connections(self) -> int:
        return len(self._writers)

    def ping(self, seq: int) -> None:
        """Ask every front connected for a PONG."""
        for writer in self._writers:
            if not writer.is_closing():
                writer.write(frame(PING, seq))

    def disconnect(self) -> None:
        """Cut every front's connection (as when this process goes away)."""
        for writer in self._writers:
            writer.close()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One front's connection: its calls until it closes."""
        self._writers.add(writer)
        calls: dict[int, asyncio.Task[None]] = {}
        try:
            while True:
                kind, call, payload = await read_frame(reader)
                if kind == REQ and call in calls:  # never from our front: ids in use skip
                    writer.write(frame(END, call, status(grpc.StatusCode.INTERNAL,
                                                         "relay: call id in use")))
                elif kind == REQ:
                    task = asyncio.get_running_loop().create_task(
                        self._call(call, payload, writer))
                    calls[call] = task
                    task.add_done_callback(partial(_forget, calls, call))
                elif kind == CANCEL and (running := calls.get(call)) is not None:
                    running.cancel()
                elif kind == PONG:
                    self.stats = FrontStats.unpack(payload)  # ValueError: closed below
                    self.answered, self.answered_seq = time.monotonic(), call
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except ValueError as exc:
            log.error("relay: the front sent %s; closing its connection", exc)
        finally:
            self._writers.discard(writer)
            for task in list(calls.values()):
                task.cancel()
            writer.close()

    async def _call(self, call: int, payload: bytes, writer: asyncio.StreamWriter) -> None:
        try:
            method, peer, body = parse_request(payload)
        except (ValueError, UnicodeDecodeError) as exc:
            writer.write(frame(END, call, status(grpc.StatusCode.INTERNAL, str(exc))))
            return
        found = self._methods.get(method)
        if found is None:
            writer.write(frame(END, call, status(grpc.StatusCode.UNIMPLEMENTED,
                                                 f"{method[:200]} is not relayed")))
            return
        handler, context = found.handler, RelayedContext(peer)
        try:
            message = handler.request_deserializer(body)
        except Exception:  # protobuf's DecodeError among others
            writer.write(frame(END, call, status(grpc.StatusCode.INTERNAL,
                                                 "Exception deserializing request!")))
            return
        end = status(grpc.StatusCode.OK, "")
        try:
            if found.streaming:
                async with contextlib.aclosing(handler.unary_stream(message, context)) as got:
                    async for reply in got:
                        writer.write(frame(MSG, call, _reply(handler, reply)))
                        await writer.drain()
            else:
                reply = _reply(handler, await handler.unary_unary(message, context))
                if not writer.is_closing():  # the reply and its status in one write
                    writer.write(frame(MSG, call, reply) + frame(END, call, end))
                return
        except grpc.aio.AbortError:
            end = status(context.code() or grpc.StatusCode.UNKNOWN, context.details)
        except Overloaded as exc:
            end = status(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the client went away (CANCEL) or the front did: nothing to send
            log.error("%s: its handler was cancelled from inside", method)
            end = status(grpc.StatusCode.UNKNOWN, f"Unexpected CancelledError in {method}")
        except Exception as exc:  # as grpc answers a handler that raised
            log.error("%s failed: %s", method, exc, exc_info=exc)
            end = status(grpc.StatusCode.UNKNOWN,
                         f"Unexpected {type(exc)}: {str(exc)[:200]}")
        if not writer.is_closing():
            writer.write(frame(END, call, end))


def _reply(handler: Any, message: Any) -> bytes:
    """The reply's bytes; Overloaded past MAX_REPLY (the call then ends
    RESOURCE_EXHAUSTED, as gRPC ends a message past its limit; the connection and every
    other call go on)."""
    raw: bytes = handler.response_serializer(message)
    if len(raw) > MAX_REPLY:
        raise Overloaded(f"a reply of {len(raw)} bytes (the relay carries at most "
                        f"{MAX_REPLY})")
    return raw


def _forget(calls: dict[int, asyncio.Task[None]], call: int, _: object) -> None:
    calls.pop(call, None)


# -- the front ---------------------------------------------------------------------------------


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


class _Inbox:
    """A relayed stream's frames not yet taken: the newest message only (each is a whole
    state, so an older one untaken is of no use), then the end."""

    def __init__(self) -> None:
        self._message: bytes | None = None
        self._end: bytes | None = None
        self._ready = asyncio.Event()

    def put(self, kind: int, payload: bytes) -> None:
        if kind == MSG and self._end is None:
            self._message = payload  # replaces one not taken yet
        elif kind == END and self._end is None:
            self._end = payload
        self._ready.set()

    async def get(self) -> tuple[int, bytes]:
        """(MSG, message) while one waits, then (END, status)."""
        while True:
            if self._message is not None:
                message, self._message = self._message, None
                return MSG, message
            if self._end is not None:
                return END, self._end
            self._ready.clear()
            await self._ready.wait()


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
    """``python -m gpuscale.scaler.edges.relay``: started by the fleet process, never by a
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


class Front:
    """The front as the fleet process runs it: a child process on KEDA's port, connected to
    ``backend`` by a socket pair (nothing on the file system, nothing else can connect)."""

    def __init__(self, backend: RelayBackend, heartbeat_s: float = HEARTBEAT_S,
                 wedged_s: float = WEDGED_S) -> None:
        self.backend = backend
        self.heartbeat_s, self.wedged_s = heartbeat_s, wedged_s
        self.port = 0
        self._proc: asyncio.subprocess.Process | None = None
        self._serving: asyncio.Task[None] | None = None

    async def start(self, address: str, tls: Any, options: list[tuple[str, int]]) -> int:
        """Start the child; the port it bound. OSError when it could not listen
        (everything started is stopped again)."""
        import json

        ours, theirs = socket.socketpair()
        try:
            reader, writer = await asyncio.open_unix_connection(sock=ours)
            self._serving = asyncio.get_running_loop().create_task(
                self.backend.serve(reader, writer))
            argv = [sys.executable, "-P", "-m", "gpuscale.scaler.edges.relay",
                    "--fd", str(theirs.fileno()), "--address", address,
                    "--options", json.dumps(dict(options))]
            if tls is not None:
                argv += ["--tls", str(tls.cert), str(tls.key), str(tls.ca)]
            proc = self._proc = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.PIPE,  # its log lines: this stderr
                pass_fds=(theirs.fileno(),))
            theirs.close()
            assert proc.stdout is not None
            line = (await proc.stdout.readline()).decode().strip()
            if not line.startswith("listening "):
                await proc.wait()
                raise OSError(line.removeprefix("cannot listen: ") or
                              f"the gRPC front exited with {proc.returncode}")
        except BaseException:
            theirs.close()
            await self.stop()
            raise
        self.port = int(line.split()[1])
        return self.port

    async def watch(self) -> None:
        """Until the child ends, or answers no ping for ``wedged_s`` of rounds in a row
        (then it is killed): then RuntimeError (the scaler cannot answer KEDA). Counted in
        rounds - a ping, then ``heartbeat_s`` for its answer - so a pause of this process
        (a stopped VM) costs a round or two, not a kill."""
        proc = self._proc
        assert proc is not None
        backend = self.backend
        backend.answered = time.monotonic()
        ended = asyncio.get_running_loop().create_task(proc.wait())
        seq, missed = 0, 0
        try:
            while not ended.done():
                seq, before = seq % (ID_SPACE - 1) + 1, backend.answered_seq
                backend.ping(seq)
                await asyncio.wait((ended,), timeout=self.heartbeat_s)
                # any answer in the round counts: a busy front may answer an earlier ping
                missed = 0 if backend.answered_seq != before else missed + 1
                if not ended.done() and missed * self.heartbeat_s >= self.wedged_s:
                    silent = self.silent_s()
                    log.error("the scaler's gRPC front has not answered for %.0f s; killing "
                              "it and stopping", silent)
                    proc.kill()
                    await ended
                    raise RuntimeError(f"the scaler's gRPC front did not answer for "
                                       f"{silent:.0f} s (killed)")
        finally:
            ended.cancel()
        code = proc.returncode
        log.error("the scaler's gRPC front exited with %s; stopping", code)
        raise RuntimeError(f"the scaler's gRPC front exited with {code}")

    def silent_s(self) -> float:
        """Seconds since the front last answered a ping."""
        return time.monotonic() - self.backend.answered

    async def stop(self, stopping: asyncio.Event | None = None) -> None:
        """Graceful, as the in-process server stops: the child refuses new calls
        (SIGTERM), then ``stopping`` is set (this process ends its streams, their ends
        reach KEDA through the child), then the child is waited for (killed past the
        grace)."""
        proc = self._proc
        if proc is not None and proc.returncode is None:
            proc.terminate()
        if stopping is not None:
            stopping.set()
        if proc is not None:
            try:
                await asyncio.shield(asyncio.wait_for(proc.wait(), STOP_GRACE_S + 2))
            except TimeoutError:
                proc.kill()
                await asyncio.shield(proc.wait())
        self.backend.disconnect()
        if self._serving is not None:
            self._serving.cancel()


if __name__ == "__main__":
    sys.exit(main())
