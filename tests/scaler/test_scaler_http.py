"""The scaler's /metrics, /healthz and /readyz port against hostile peers, over real
sockets: a request head past its byte bound, more connections than it holds, a head that
never finishes - each refused, counted, and the port serves on."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, Counter

from gpuscale.scaler.edges.http import MAX_HEAD_BYTES, ScalerHttp
from tests.support.polling import until
from tests.support.ports import free_port


@pytest.fixture
async def http() -> AsyncIterator[tuple[ScalerHttp, str]]:
    registry = CollectorRegistry()
    Counter("gpuscale_test_answers", "a family to see", registry=registry).inc()
    port = free_port()
    server = ScalerHttp(registry, lambda: (True, "1 agent"), "127.0.0.1", port)
    await server.start()
    yield server, f"http://127.0.0.1:{port}"
    await server.stop()


async def get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url) as r:
        return r.status, await r.text()


async def test_the_three_paths_and_nothing_else(http: tuple[ScalerHttp, str]) -> None:
    _, url = http
    status, body = await get(f"{url}/metrics")
    assert status == 200
    assert "gpuscale_test_answers_total 1.0" in body
    assert await get(f"{url}/healthz") == (200, "ok\n")
    assert await get(f"{url}/readyz") == (200, "ok: 1 agent\n")
    assert (await get(f"{url}/nope"))[0] == 404
    async with aiohttp.ClientSession() as session, session.post(
            f"{url}/metrics", data=b"x" * 10_000) as r:
        assert r.status == 405


async def open_head(url: str, head: bytes) -> tuple[asyncio.StreamReader,
                                                    asyncio.StreamWriter]:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(head)
    await writer.drain()
    return reader, writer


async def test_a_head_past_its_bound_is_431_and_closed(http: tuple[ScalerHttp, str]) -> None:
    """Ten headers of 4 KB: each within aiohttp's own limits, together past MAX_HEAD_BYTES
    (aiohttp alone would have held 128 x 8 KB per connection, for as long as it took)."""
    server, url = http
    lines = b"".join(b"X-H%d: %s\r\n" % (i, b"a" * 4000) for i in range(10))
    assert len(lines) > MAX_HEAD_BYTES
    reader, writer = await open_head(url, b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + lines)
    answer = await asyncio.wait_for(reader.read(), 10)  # then closed: read() ends
    assert answer.startswith(b"HTTP/1.1 431 ")
    writer.close()
    assert server.bounds.too_large == 1
    assert (await get(f"{url}/healthz"))[0] == 200


async def test_a_malformed_head_is_answered_without_a_traceback(
        http: tuple[ScalerHttp, str], caplog: pytest.LogCaptureFixture) -> None:
    """aiohttp logs each request it cannot parse with a traceback: a peer could fill the
    scaler's log at will. Here: a 400 and nothing logged."""
    _, url = http
    lines = b"".join(b"X-H%d: a\r\n" % i for i in range(100))  # past MAX_HEADERS
    for head in (b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + lines + b"\r\n",
                 b"\x16\x03\x01\x00\xff garbage\r\n\r\n"):
        reader, writer = await open_head(url, head)
        answer = await asyncio.wait_for(reader.read(), 10)
        assert answer.split(b"\r\n")[0].endswith(b" 400 Bad Request")
        writer.close()
    assert [r for r in caplog.records if r.name.startswith("aiohttp")] == []


async def test_connections_past_the_cap_are_closed_and_the_port_recovers(
        http: tuple[ScalerHttp, str]) -> None:
    server, url = http
    server.bounds.max_connections = 5
    held = [await open_head(url, b"GET /metr") for _ in range(5)]
    await until(lambda: server.bounds.open == 5, what="five connections held")
    reader, writer = await open_head(url, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert await asyncio.wait_for(reader.read(), 10) == b""  # closed, unanswered
    writer.close()
    assert server.bounds.refused == 1
    for _, w in held:
        w.close()
    await until(lambda: server.bounds.open == 0, what="the held connections gone")
    assert (await get(f"{url}/healthz"))[0] == 200


async def test_a_head_that_never_finishes_is_closed(http: tuple[ScalerHttp, str]) -> None:
    server, url = http
    server.bounds.head_timeout_s = 0.2
    reader, writer = await open_head(url, b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    assert await asyncio.wait_for(reader.read(), 10) == b""
    writer.close()
    assert server.bounds.timed_out == 1
    assert (await get(f"{url}/healthz"))[0] == 200
