"""The relay's frames on the private unix socket between the front and the fleet process
(scaler.edges.relay): hostile request frames get a status or end the connection, frames
parse or say why, status frames never raise, and a PONG is recorded or ends the
connection."""

from __future__ import annotations

import asyncio
import socket
import struct

import grpc
from hypothesis import given
from hypothesis import strategies as st

from gpuscale.proto import externalscaler_pb2 as pb
from gpuscale.scaler.answers import Answers
from gpuscale.scaler.edges.keda import ScalerService
from gpuscale.scaler.edges.keda import add_to_server as add_keda
from gpuscale.scaler.edges.relay import (
    CANCEL,
    END,
    HEADER,
    MAX_FRAME,
    MSG,
    PONG,
    REQ,
    FrontStats,
    frame,
    parse_request,
    parse_status,
    read_frame,
    request,
)
from gpuscale.scaler.edges.relay_backend import RelayBackend
from gpuscale.scaler.state.fleet import FleetView
from tests.scaler.relay_calls import REF, rec
from tests.support.polling import until


async def _backend_pair(fleet: FleetView) -> tuple[asyncio.StreamReader,
                                                   asyncio.StreamWriter, asyncio.Task[None]]:
    """A raw connection to the fleet process's side, as a (possibly hostile) front."""
    backend = RelayBackend([lambda s: add_keda(ScalerService(Answers(fleet)), s)])
    ours, theirs = socket.socketpair()
    reader, writer = await asyncio.open_unix_connection(sock=ours, limit=MAX_FRAME)
    r2, w2 = await asyncio.open_unix_connection(sock=theirs, limit=MAX_FRAME)
    return reader, writer, asyncio.get_running_loop().create_task(backend.serve(r2, w2))


async def test_hostile_frames_get_a_status_or_end_the_connection(fleet: FleetView) -> None:
    reader, writer, serving = await _backend_pair(fleet)
    fleet.update_node("node-a", [rec("v-0", 42.0)])
    method = "/externalscaler.ExternalScaler/GetMetrics"
    body = pb.GetMetricsRequest(scaledObjectRef=REF,
                                metricName="gpuscale-gpu-utilization").SerializeToString()
    cases = {
        1: frame(REQ, 1, request(method, "peer", body)),  # a good one
        2: frame(REQ, 2, b"\x00\x05ab"),  # truncated
        3: frame(REQ, 3, request("/nope.Nope/Nothing", "peer", b"")),
        4: frame(REQ, 4, request(method, "peer", b"\xff\xff\xff")),  # not protobuf
        5: frame(REQ, 5, b"\x00\x02\xc3\x28\x00\x00"),  # not UTF-8
    }
    for raw in cases.values():
        writer.write(raw)
    writer.write(frame(CANCEL, 99))  # a call that does not exist: ignored
    ends: dict[int, tuple[grpc.StatusCode, str]] = {}
    got: dict[int, bytes] = {}
    while len(ends) < len(cases):
        kind, call, payload = await asyncio.wait_for(read_frame(reader), 5)
        if kind == MSG:
            got[call] = payload
        elif kind == END:
            ends[call] = parse_status(payload)
    assert ends[1][0] is grpc.StatusCode.OK
    assert pb.GetMetricsResponse.FromString(got[1]).metricValues[0].metricValueFloat == 42.0
    assert ends[2] == (grpc.StatusCode.INTERNAL, "truncated request frame")
    assert ends[3][0] is grpc.StatusCode.UNIMPLEMENTED
    assert ends[4] == (grpc.StatusCode.INTERNAL, "Exception deserializing request!")
    assert ends[5][0] is grpc.StatusCode.INTERNAL
    # A frame past the limit ends the connection (and every call on it), nothing else.
    writer.write(HEADER.pack(MAX_FRAME + 1, REQ, 6))
    await asyncio.wait_for(serving, 5)
    assert await reader.read() == b""
    writer.close()


@given(st.binary(max_size=300))
def test_request_frames_parse_or_say_why(payload: bytes) -> None:
    try:
        method, peer, body = parse_request(payload)
    except (ValueError, UnicodeDecodeError):
        return
    assert request(method, peer, body) == payload


@given(st.text(max_size=60), st.text(max_size=60), st.binary(max_size=100))
def test_request_frames_round_trip(method: str, peer: str, body: bytes) -> None:
    assert parse_request(request(method, peer, body)) == (method, peer[:1000], body)


def test_status_frames_never_raise() -> None:
    assert parse_status(b"")[0] is grpc.StatusCode.INTERNAL
    assert parse_status(struct.pack("!B", 250) + b"x") == (grpc.StatusCode.UNKNOWN, "x")


async def test_a_pong_is_recorded_and_one_that_is_not_ends_the_connection(
        fleet: FleetView) -> None:
    backend = RelayBackend([lambda s: add_keda(ScalerService(Answers(fleet)), s)])
    ours, theirs = socket.socketpair()
    reader, writer = await asyncio.open_unix_connection(sock=ours)
    r2, w2 = await asyncio.open_unix_connection(sock=theirs)
    serving = asyncio.get_running_loop().create_task(backend.serve(r2, w2))
    writer.write(frame(PONG, 41, FrontStats(1.5, 2**30, (3, 2, 1)).pack()))
    await until(lambda: backend.answered_seq == 41, within=5, what="the PONG")
    assert backend.stats == FrontStats(1.5, 2**30, (3, 2, 1))
    writer.write(frame(PONG, 42, FrontStats(float("nan"), 1, (0, 0, 0)).pack()))
    await asyncio.wait_for(serving, 5)
    assert await reader.read() == b""
    assert backend.answered_seq == 41
    writer.close()


@given(st.one_of(st.binary(max_size=64), st.binary(min_size=32, max_size=32)))
def test_pong_payloads_parse_or_say_why(payload: bytes) -> None:
    try:
        stats = FrontStats.unpack(payload)
    except ValueError:
        return
    assert stats.pack() == payload
    assert stats.cpu_s >= 0
