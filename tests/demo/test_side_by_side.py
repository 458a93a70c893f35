"""Simulated engines choose their addresses free: two ``gpuscale demo --scenario`` runs
(and the test suite beside them) serve the same scenario's engines at once, and every
engine signal of both is OK - not ``connection refused`` from the other's engines."""

from __future__ import annotations

import asyncio
import socket

import grpc
import pytest

from gpuscale.engines.simulated_engines import EngineSockets
from gpuscale.proto import externalscaler_pb2 as pb
from gpuscale.proto import externalscaler_pb2_grpc as pb_grpc
from tests.support.polling import until_sync
from tests.support.ports import free_port
from tests.support.processes import start_scenario_scaler

ENGINE_TRIGGERS = (("tgi-small", "tgi-inference", "s0-gpuscale-tgi-queue"),
                   ("triton-embed", "triton-inference", "s0-gpuscale-triton-pending"))


def _value(address: str, app: str, profile: str, metric: str) -> float | str:
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.ExternalScalerStub(channel)
        ref = pb.ScaledObjectRef(name=app, namespace="llm", scalerMetadata={
            "podSelector": f"app={app}", "profile": profile})
        try:
            got = stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=ref, metricName=metric),
                                  timeout=5)
        except grpc.RpcError as exc:
            return f"{exc.code().name}: {exc.details()}"
        return float(got.metricValues[0].metricValueFloat)


@pytest.mark.slow
def test_two_scenario_demos_serve_their_engines_side_by_side() -> None:
    ports = free_port(), free_port()
    first = start_scenario_scaler(ports[0])
    try:
        second = start_scenario_scaler(ports[1])
        try:
            for address in (f"127.0.0.1:{p}" for p in ports):
                for app, profile, metric in ENGINE_TRIGGERS:
                    def ok(a: str = address, p: str = app, f: str = profile,
                           m: str = metric) -> bool:
                        return isinstance(_value(a, p, f, m), float)
                    until_sync(ok, 15.0, f"{app}'s engine signal OK at {address}")
        finally:
            second.stop()
    finally:
        first.stop()


async def test_a_claimed_engine_address_refuses_until_served() -> None:
    """As a real engine that is loading its model: its port refuses connections until
    the server listens, then answers; released, the port is free again."""
    sockets = EngineSockets()
    port = sockets.claim("127.1.0.10")
    try:
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection("127.1.0.10", port)
        runner = await sockets.serve("127.1.0.10", port, lambda: "# nothing\n")
        try:
            reader, writer = await asyncio.open_connection("127.1.0.10", port)
            writer.write(b"GET /metrics HTTP/1.0\r\n\r\n")
            assert (await reader.read()).endswith(b"# nothing\n")
            writer.close()
        finally:
            await runner.cleanup()
        other = sockets.claim("127.1.0.10")
        assert other != 0
        sockets.release("127.1.0.10", other)
        with socket.socket() as s:  # released: anyone may bind it
            s.bind(("127.1.0.10", other))
    finally:
        sockets.close()
