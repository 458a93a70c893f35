"""KEDA's gRPC port in a process of its own (``gpuscale scaler --answer-process``): the
relay's design, and the protocol both of its ends speak.

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

The parts: this module (frames, limits, the methods relayed, a whole-state stream's inbox);
``relay_backend`` (the fleet process's side: runs each call against the servicers);
``relay_front`` (the child process on KEDA's port); ``relay_supervisor`` (``Front``: the
fleet process starts that child, pings it and stops it).
"""

from __future__ import annotations

import asyncio
import gc
import math
import resource
import struct
from dataclasses import dataclass

import grpc

from gpuscale.proto import externalscaler_pb2, inspect_pb2

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
