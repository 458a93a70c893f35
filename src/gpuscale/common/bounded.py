"""Reading HTTP bodies with a size limit (aiohttp's ``read(n)`` returns what is buffered,
not n bytes, so a limit needs a loop). The loop is over chunks of any client: aiohttp's
(``read_bounded``, the scaler's demand sources) and httpx2's (``gather_bounded`` on its
chunks: the Kubernetes seam and the agent's engine scraper)."""

from __future__ import annotations

from collections.abc import AsyncIterable
from typing import TYPE_CHECKING

from gpuscale.common.errors import PeerError

if TYPE_CHECKING:  # only for the annotation: kube/ uses this module without aiohttp
    import aiohttp

CHUNK = 64 * 1024


class BodyTooLarge(PeerError, ValueError):
    """The body is larger than the limit; nothing past the limit was read."""


async def gather_bounded(chunks: AsyncIterable[bytes], limit: int,
                         declared: int | None = None) -> bytes:
    """The chunks joined, or BodyTooLarge as soon as more than ``limit`` bytes arrive (or
    at once when the declared Content-Length is over the limit)."""
    if declared is not None and declared > limit:
        raise BodyTooLarge(f"body over {limit} bytes")
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"body over {limit} bytes")
        parts.append(chunk)
    return b"".join(parts)


async def read_bounded(resp: aiohttp.ClientResponse, limit: int) -> bytes:
    """The whole body, or BodyTooLarge as soon as more than ``limit`` bytes arrive."""
    return await gather_bounded(resp.content.iter_chunked(CHUNK), limit, resp.content_length)
