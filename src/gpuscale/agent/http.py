"""The agent's HTTP endpoints: /metrics, /healthz, /readyz.

Handlers only render what the sampler already holds: no NVML call, no lock held across an
await. /healthz answers while the process runs; /readyz is 200 only when a sample succeeded
and the latest one is fresh, and its body says why not otherwise.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


def make_app(registry: CollectorRegistry,
             readiness: Callable[[], tuple[bool, str]]) -> web.Application:
    async def metrics(_: web.Request) -> web.Response:
        body = generate_latest(registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        ok, why = readiness()
        return web.Response(text=why + "\n", status=200 if ok else 503)

    app = web.Application(client_max_size=1024)  # we accept no request bodies
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


async def start_http(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Start serving; return the runner (for cleanup) and the bound port (0 picks one)."""
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0,
                           handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=64)
    await site.start()
    bound = int(runner.addresses[0][1]) if runner.addresses else port
    return runner, bound
