"""Whoever reaches the metrics API's port (6443), with or without a certificate: slow
clients that stall mid-request, oversized and malformed requests (a Status, one log line a
minute), connections past the cap, slow heads; none holds up the aggregator's answers."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest

from tests.metrics_api.https_cluster import V1B2, Cluster
from tests.support.polling import until


async def test_slow_clients_do_not_hold_up_the_others(cluster: Cluster) -> None:
    """200 connections that finish the TLS handshake and then send half a request line
    and stall: answers to everyone else go on."""
    stalled = []
    for _ in range(200):
        _, writer = await cluster.connect()
        writer.write(b"GET /apis/custom.metrics.k8s.io/v1beta2/namesp")
        await writer.drain()
        stalled.append(writer)
    try:
        code, body = await cluster.get(f"{V1B2}/namespaces/llm/pods/*/gpu_utilization")
        assert code == 200, body
    finally:
        for w in stalled:
            w.close()


async def _raw(cluster: Cluster, data: bytes, who: str = "") -> tuple[int, dict[str, Any]]:
    """Send ``data`` as it is over TLS (no client certificate unless ``who``); the status
    and the JSON body of the answer."""
    reader, writer = await cluster.connect(who)
    try:
        writer.write(data)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


async def test_an_oversized_request_is_a_status_and_one_log_line_a_minute(
        cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    """Without any certificate, a 10 KB+ request line or an 8 KB+ header: a Kubernetes
    Status (400, 431), never aiohttp's text, and the log gets one line per peer a minute,
    no traceback, however many come."""
    caplog.set_level(logging.WARNING)
    line = b"GET /apis/" + b"a" * 12_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    header = (b"GET /apis/custom.metrics.k8s.io/v1beta2 HTTP/1.1\r\nHost: x\r\nX-Junk: "
              + b"b" * 9_000 + b"\r\n\r\n")
    for _ in range(5):
        code, body = await _raw(cluster, line)
        assert (code, body["kind"], body["code"]) == (400, "Status", 400)
        assert "request line is larger" in body["message"]
        code, body = await _raw(cluster, header)
        assert (code, body["kind"], body["code"]) == (431, "Status", 431)
        assert "header is larger" in body["message"]
    code, body = await _raw(cluster, b"\x16\x03garbage that is not HTTP\r\n\r\n")
    assert (code, body["kind"]) == (400, "Status")
    lines = [r for r in caplog.records if "malformed request" in r.getMessage()]
    assert len(lines) == 1  # one peer (127.0.0.1): one line for its 11 bad requests
    assert lines[0].exc_info is None
    assert not [r for r in caplog.records if r.exc_info]  # no traceback anywhere
    assert cluster.server.guard.rejected == 11
    # The server goes on answering the aggregator.
    code, _ = await cluster.get(f"{V1B2}/namespaces/llm/pods/*/gpu_utilization")
    assert code == 200


async def test_connections_past_the_cap_are_closed_at_once(cluster: Cluster) -> None:
    guard = cluster.server.guard
    guard.max_connections = guard.open + 20
    held = []
    try:
        for _ in range(20):
            held.append((await cluster.connect())[1])
        await until(lambda: guard.open >= guard.max_connections, what="the cap reached")
        reader, writer = await cluster.connect()
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert await asyncio.wait_for(reader.read(), 10) == b""  # closed, unanswered
        writer.close()
        assert guard.refused >= 1
    finally:
        for w in held:
            w.close()
    await until(lambda: guard.open < guard.max_connections, what="connections released")
    code, _ = await cluster.get(f"{V1B2}/namespaces/llm/pods/*/gpu_utilization")
    assert code == 200


async def test_a_slow_loris_is_closed_after_the_head_timeout(cluster: Cluster) -> None:
    """A request head that trickles in holds its connection no longer than the head
    timeout; a connection idle between requests is the keep-alive's business."""
    guard = cluster.server.guard
    guard.head_timeout_s = 0.3
    reader, writer = await cluster.connect()
    try:
        writer.write(b"GET /apis/custom.metrics.k8s.io/v1beta2/namesp")
        for _ in range(20):  # a byte every 0.05 s: never a whole head
            await asyncio.sleep(0.05)
            if reader.at_eof():
                break
            writer.write(b"a")
        assert await asyncio.wait_for(reader.read(), 5) == b""
        assert guard.timed_out >= 1
    finally:
        writer.close()


async def test_a_keep_alive_connection_outlives_the_head_timeout(cluster: Cluster) -> None:
    """The head timeout is for a request still arriving, not for an idle keep-alive
    connection between whole requests (the aggregator keeps its connections)."""
    guard = cluster.server.guard
    guard.head_timeout_s = 0.3
    reader, writer = await cluster.connect()
    try:
        for _ in range(2):
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 200")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            await reader.readexactly(length)
            await asyncio.sleep(1.0)  # idle for three head timeouts
        assert guard.timed_out == 0
    finally:
        writer.close()
