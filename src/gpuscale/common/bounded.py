"""Reading HTTP bodies with a size limit: the package's one bounded reader.

Every HTTP client of the package (kube/, the engine scraper, the scaler's demand sources,
the PromQL client of the operator tools) sends its requests on httpx2 and reads a body
through here: ``read_bounded`` for a streamed response, ``gather_bounded`` for chunks from
elsewhere. This module imports no client library: a response is anything with ``headers``
and ``aiter_bytes`` (httpx2's ``Response`` is one), so the pure layers can import it.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Mapping
from typing import Protocol

from gpuscale.common.errors import PeerError

CHUNK = 64 * 1024


class BodyTooLarge(PeerError, ValueError):
    """The body is larger than the limit; nothing past the limit was read."""


class StreamedResponse(Protocol):
    """What ``read_bounded`` needs of a response whose body has not been read yet."""

    @property
    def headers(self) -> Mapping[str, str]: ...

    def aiter_bytes(self, chunk_size: int | None = None) -> AsyncIterator[bytes]: ...


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


def declared_length(resp: StreamedResponse) -> int | None:
    """The response's Content-Length, or None when it has none (or not a number)."""
    try:
        return int(resp.headers["content-length"])
    except (KeyError, ValueError):
        return None


async def read_bounded(resp: StreamedResponse, limit: int) -> bytes:
    """The whole body, or BodyTooLarge as soon as more than ``limit`` bytes arrive (at
    once when Content-Length says so). A compressed body counts its inflated bytes: the
    client inflates it in pieces as it is read, so a small body that inflates to a large
    one is cut at the limit, not held whole."""
    return await gather_bounded(resp.aiter_bytes(CHUNK), limit, declared_length(resp))
