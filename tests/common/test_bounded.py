"""The package's one bounded reader, on httpx2 (the package's HTTP client) against a raw
HTTP/1.1 peer on loopback that answers what a hostile server would: a Content-Length past
the limit, a body that never ends, a small gzip body that inflates past the limit."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx2
import pytest

from gpuscale.common.bounded import BodyTooLarge, read_bounded

LIMIT = 64 * 1024
Reply = Callable[[asyncio.StreamWriter], Awaitable[None]]


def _head(*headers: str) -> bytes:
    return ("HTTP/1.1 200 OK\r\n" + "".join(f"{h}\r\n" for h in headers) + "\r\n").encode()


def _exact(size: int) -> Reply:
    async def reply(w: asyncio.StreamWriter) -> None:
        w.write(_head(f"Content-Length: {size}") + b"x" * size)
    return reply


async def _declares_too_much(w: asyncio.StreamWriter) -> None:
    w.write(_head(f"Content-Length: {LIMIT + 1}") + b"x")  # and then nothing, ever
    await asyncio.sleep(30)


async def _never_ends(w: asyncio.StreamWriter) -> None:
    w.write(_head("Transfer-Encoding: chunked"))
    while True:  # 1 KiB chunks for as long as the client reads
        w.write(b"400\r\n" + b"y" * 1024 + b"\r\n")
        await w.drain()


async def _gzip_bomb(w: asyncio.StreamWriter) -> None:
    body = gzip.compress(b"\0" * (16 * LIMIT))  # ~1 KiB that inflates to 1 MiB
    w.write(_head("Content-Encoding: gzip", f"Content-Length: {len(body)}") + body)


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Reply], Awaitable[str]]]:
    """Start a peer that answers every request with ``reply``; returns its URL."""
    servers: list[asyncio.Server] = []

    async def start(reply: Reply) -> str:
        async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            try:
                await r.readuntil(b"\r\n\r\n")
                await reply(w)
                await w.drain()
            except (ConnectionError, asyncio.IncompleteReadError):
                pass
            finally:
                w.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        servers.append(server)
        return f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/"

    yield start
    for s in servers:
        s.close()


async def _get(url: str) -> bytes:
    async with httpx2.AsyncClient(trust_env=False) as client, asyncio.timeout(5), \
            client.stream("GET", url) as resp:
        return await read_bounded(resp, LIMIT)


@pytest.mark.parametrize("size", [0, 1, LIMIT])
async def test_a_body_up_to_the_limit_is_read_whole(
        serve: Callable[[Reply], Awaitable[str]], size: int) -> None:
    assert await _get(await serve(_exact(size))) == b"x" * size


@pytest.mark.parametrize("reply", [_exact(LIMIT + 1), _declares_too_much, _never_ends,
                                   _gzip_bomb],
                         ids=["one byte over", "declared over, never sent",
                              "never ends", "gzip inflating past the limit"])
async def test_past_the_limit_is_refused_without_waiting_for_the_rest(
        serve: Callable[[Reply], Awaitable[str]], reply: Reply) -> None:
    """Refused as soon as the limit is passed (or declared passed): the peers that never
    finish would hold a reader that waited for the end past the 5 s timeout."""
    with pytest.raises(BodyTooLarge, match=f"body over {LIMIT} bytes"):
        await _get(await serve(reply))
