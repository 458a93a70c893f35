"""The relay's fleet-process side (``scaler.edges.relay``): each call the front relays is
run against the very servicer methods the in-process server runs (one answer function), and
its replies and final status go back as they are. A call the front cancels is cancelled
here."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import grpc

from gpuscale.common.errors import Overloaded
from gpuscale.scaler.edges import relay as wire
from gpuscale.scaler.edges.relay import (
    CANCEL,
    END,
    MSG,
    PING,
    PONG,
    REQ,
    FrontStats,
    frame,
    parse_request,
    read_frame,
    status,
)

log = logging.getLogger(__name__)


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
    limit = wire.MAX_REPLY  # (read on each call: a test lowers it)
    if len(raw) > limit:
        raise Overloaded(f"a reply of {len(raw)} bytes (the relay carries at most {limit})")
    return raw


def _forget(calls: dict[int, asyncio.Task[None]], call: int, _: object) -> None:
    calls.pop(call, None)

