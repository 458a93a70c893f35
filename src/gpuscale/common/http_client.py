"""The package's one HTTP client, made the same way by every caller (the agent's engine
scraper, the scaler's demand sources, the PromQL client of the operator tools): httpx2,
the client the Kubernetes seam already sends on, with nothing taken from the environment
(no proxies, no netrc), no redirects and no cookies (a poll or a scrape carries no session:
a jar would keep whatever a peer sends). And a failed request in words for a person."""

from __future__ import annotations

import asyncio
import errno
import ssl
from collections.abc import Mapping
from http.cookiejar import CookieJar, DefaultCookiePolicy
from urllib.parse import urlsplit

import httpx2


async def system_tls() -> ssl.SSLContext:
    """https verified against the system's CAs, as ``ssl.create_default_context`` finds
    them (``SSL_CERT_FILE`` included); loading them takes ~17 ms, so not on the loop."""
    return await asyncio.to_thread(ssl.create_default_context)


def new_client(timeout_s: float, tls: ssl.SSLContext, connections: int | None = None,
               headers: Mapping[str, str] | None = None) -> httpx2.AsyncClient:
    """A client whose requests time out after ``timeout_s``; ``connections``: the pool's
    size (kept alive), else httpx2's default."""
    limits = (httpx2.Limits(max_connections=connections,
                            max_keepalive_connections=connections)
              if connections is not None else httpx2.Limits())
    return httpx2.AsyncClient(
        trust_env=False, follow_redirects=False, verify=tls, limits=limits,
        timeout=httpx2.Timeout(timeout_s),
        cookies=CookieJar(DefaultCookiePolicy(allowed_domains=[])), headers=headers)


def check_port(url: str) -> None:
    """ValueError for a port out of range, which httpx2 would let escape from its connect
    as a bare ExceptionGroup instead of an HTTPError."""
    urlsplit(url).port  # noqa: B018


def describe(exc: httpx2.HTTPError, in_body: bool) -> str:
    """A failed request in words (not a class name); ``in_body``: it failed after the
    status line and headers had arrived."""
    if isinstance(exc, httpx2.ConnectError):
        os_error = _os_error(exc)
        if os_error is not None and os_error.errno == errno.ECONNREFUSED:
            return "connection refused"
        why = (os_error.strerror if os_error is not None else None) or exc
        return f"cannot connect: {why}"[:160]
    if isinstance(exc, httpx2.DecodingError):
        return f"body cannot be decoded: {exc}"[:160]
    if in_body:
        return f"body cut short: {exc}"[:160]
    if isinstance(exc, (httpx2.RemoteProtocolError, httpx2.ReadError)):
        return f"no HTTP answer: {exc}"[:160]
    return f"{type(exc).__name__}: {exc}"[:160]


def _os_error(exc: BaseException) -> OSError | None:
    """The operating system's error under the client's (which wraps it, and for a connect
    attempt wraps it once more in an OSError without an errno)."""
    todo: list[BaseException] = [exc]
    for _ in range(16):  # a chain is a few links deep; never follow a cycle for ever
        if not todo:
            break
        e = todo.pop()
        if isinstance(e, OSError) and e.errno is not None:
            return e
        todo += [c for c in (e.__cause__, e.__context__) if c is not None]
        if isinstance(e, BaseExceptionGroup):
            todo += e.exceptions
    return None
