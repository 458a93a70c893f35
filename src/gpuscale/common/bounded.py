"""Reading HTTP bodies with a size limit (aiohttp's ``read(n)`` returns what is buffered,
not n bytes, so a limit needs a loop)."""

from __future__ import annotations

import aiohttp

from gpuscale.common.errors import PeerError


class BodyTooLarge(PeerError, ValueError):
    """The body is larger than the limit; nothing past the limit was read."""


async def read_bounded(resp: aiohttp.ClientResponse, limit: int) -> bytes:
    """The whole body, or BodyTooLarge as soon as more than ``limit`` bytes arrive."""
    if resp.content_length is not None and resp.content_length > limit:
        raise BodyTooLarge(f"body over {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    while chunk := await resp.content.read(64 * 1024):
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"body over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
