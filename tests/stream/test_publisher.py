"""The agent's publisher when a subscriber leaves: nothing of its stream is left behind."""

from __future__ import annotations

import asyncio
import gc
import logging

import grpc
import pytest

from gpuscale.proto import telemetry_pb2 as pb
from gpuscale.proto import telemetry_pb2_grpc as tpb_grpc
from gpuscale.stream.publisher import TelemetryPublisher
from gpuscale.stream.records import NodeReport
from tests.support.polling import until


def _waiting_on_a_mailbox() -> list[asyncio.Task[object]]:
    """Tasks of a Subscribe call still waiting for an update or for the agent to stop."""
    return [t for t in asyncio.all_tasks() if not t.done() and any(
        name in repr(t.get_coro()) for name in ("_Mailbox.get", "Event.wait"))]


async def test_a_subscriber_leaving_logs_no_error_and_leaves_no_task(
        caplog: pytest.LogCaptureFixture) -> None:
    """`gpuscale gpus --agent` reads a few updates and hangs up: the call is cancelled
    while Subscribe waits for the next update. Its waits are cancelled with it - none is
    left pending for the collector to find ("Task was destroyed but it is pending!",
    logged by asyncio at ERROR after each client)."""
    pub = TelemetryPublisher("node-a", 1.0)
    server = grpc.aio.server()
    tpb_grpc.add_AgentTelemetryServicer_to_server(pub, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    caplog.set_level(logging.DEBUG, logger="asyncio")
    try:
        pub.publish_report(NodeReport("node-a", 1, 0.0, 1.0, (), ()))
        for _ in range(2):  # two clients, one after the other
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = tpb_grpc.AgentTelemetryStub(channel)
                call = stub.Subscribe(pb.SubscribeRequest(subscriber="gpus"))
                first = await call.read()
                assert first.seq == 1
                await until(_waiting_on_a_mailbox, 5.0, "Subscribe waiting")
                call.cancel()
            await until(lambda: pub.subscribers == 0, 5.0, "the subscriber gone")
            await until(lambda: not _waiting_on_a_mailbox(), 5.0, "its waits ended")
            gc.collect()
            await asyncio.sleep(0)
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert errors == []
    finally:
        await server.stop(0)
