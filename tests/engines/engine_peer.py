"""A simulated engine pod for the scraper's tests: a real HTTP server for one pod's /metrics
that counts the requests it gets and can misbehave as an engine or a proxy might (drip,
hang, chunk, redirect), and the pods and attributions that point the scraper at it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from aiohttp import web

from gpuscale.attribution.model import AttributionState, NodeAttribution, PodInfo, PodUsage
from gpuscale.engines.scrape import EngineReading
from gpuscale.telemetry.model import Absent

DATA = Path(__file__).parent / "data"
VLLM = (DATA / "vllm_metrics.txt").read_bytes()


def pod(name: str, port: int, engine: str = "vllm", path: str = "/metrics",
        ip: str = "127.0.0.1", ready: bool = True) -> PodInfo:
    return PodInfo("llm", name, f"uid-{name}", ip=ip, ready=ready, annotations=(
        ("gpuscale.io/engine", engine), ("gpuscale.io/metrics-path", path),
        ("gpuscale.io/metrics-port", str(port))))


def holding_gpus(*names: str) -> NodeAttribution:
    """An attribution in which these pods of namespace llm hold a GPU each."""
    return NodeAttribution(AttributionState.OK, pods=tuple(
        PodUsage("llm", n, "engine", "nvidia.com/gpu", (), 50.0, 1, 2) for n in names))


class Engine:
    """One engine pod's /metrics, a real HTTP server that counts the requests it gets.

    ``body(n)`` and ``status(n)`` answer request n (from 1). ``drip``: send headers, then
    one byte every 50 ms, forever. ``silent``: accept and never answer. ``chunked``: no
    Content-Length, so the body limit must be found while reading."""

    def __init__(self, body: bytes | Callable[[int], bytes] = VLLM,
                 status: int | Callable[[int], int] = 200,
                 drip: bool = False, silent: bool = False, chunked: bool = False,
                 on_request: Callable[[int], None] | None = None) -> None:
        self.body, self.status = body, status
        self.drip, self.silent, self.chunked = drip, silent, chunked
        self.on_request = on_request
        self.requests = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        if self.on_request is not None:
            self.on_request(self.requests)
        if self.silent:
            await asyncio.Event().wait()
        if self.drip:
            resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
            await resp.prepare(request)
            try:
                while True:  # the peer's own pace, not test synchronisation
                    await resp.write(b"#")
                    await asyncio.sleep(0.05)
            except ConnectionResetError:  # the scraper gave up: as it should
                return resp
        body = self.body(self.requests) if callable(self.body) else self.body
        status = self.status(self.requests) if callable(self.status) else self.status
        if self.chunked:
            resp = web.StreamResponse(status=status)
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            for i in range(0, len(body), 256 * 1024):
                await resp.write(body[i:i + 256 * 1024])
            await resp.write_eof()
            return resp
        return web.Response(body=body, status=status, content_type="text/plain")

    async def redirect(self, _: web.Request) -> web.StreamResponse:
        self.requests += 1
        raise web.HTTPFound("/metrics")  # must not be followed

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self.handle)
        app.router.add_get("/redirect", self.redirect)
        return app


def waiting(r: EngineReading | None) -> float:
    """The reading's vllm-waiting (the request number, for bodies made by ``numbered``)."""
    value = r.signals["vllm-waiting"] if r else 0.0
    assert not isinstance(value, Absent), r
    return value


def numbered(n: int) -> bytes:
    return f"vllm:num_requests_waiting {n}\nvllm:num_requests_running 1\n".encode()
