"""The agent's root: one task group owns the sampler and the HTTP server.

Start order: backend, registry, sampler, HTTP server; the server starts listening at once
(/healthz answers, /readyz says "no sample yet"). SIGTERM or SIGINT cancel the group; the
HTTP server is cleaned up with a bounded timeout and the backend is closed last.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, disable_created_metrics

from gpuscale.agent.exporter import SnapshotCollector
from gpuscale.agent.http import make_app, start_http
from gpuscale.agent.sampler import Sampler
from gpuscale.attribution.model import NodeAttribution
from gpuscale.attribution.sources import AttributionSources, attribute_tick
from gpuscale.engines.scrape import EngineScraper
from gpuscale.telemetry.backend import GpuBackend
from gpuscale.telemetry.model import Absent, NodeSnapshot, Reading

log = logging.getLogger(__name__)

DEFAULT_METRICS_PORT = 9400  # dcgm-exporter's port, so existing scrape configs keep working


@dataclass(frozen=True)
class AgentConfig:
    host: str = "0.0.0.0"
    port: int = DEFAULT_METRICS_PORT
    interval: float = 1.0
    hostname: str = ""


class Agent:
    """Everything one agent process runs, for the CLI and for in-process tests."""

    def __init__(self, backend: GpuBackend, config: AgentConfig,
                 sources: AttributionSources | None = None) -> None:
        self.config = config
        self.backend = backend
        self.sources = sources
        disable_created_metrics()  # type: ignore[no-untyped-call]  # *_created: noise here
        self.registry = CollectorRegistry(auto_describe=False)
        attributor = None
        if sources is not None:
            async def attributor(snap: NodeSnapshot) -> NodeAttribution:
                return await attribute_tick(sources, snap)
        self.sampler = Sampler(backend, config.interval, self.registry,
                               attributor=attributor)
        self.engines = (EngineScraper(sources.pod_infos, config.interval)
                        if sources is not None else None)
        # In Kubernetes the downward API sets NODE_NAME; dcgm-exporter labels by node too.
        hostname = config.hostname or os.environ.get("NODE_NAME") or socket.gethostname()
        self.registry.register(SnapshotCollector(lambda: self.sampler.latest, hostname,
                                                 attribution=lambda: self.sampler.attribution))
        self.port: int | None = None

    async def run(self, on_listening: Callable[[int], None] | None = None) -> None:
        """Run until cancelled. ``on_listening(port)`` is called once the port is bound."""
        runner, self.port = await start_http(
            make_app(self.registry, self.sampler.readiness), self.config.host, self.config.port)
        try:
            if on_listening is not None:
                on_listening(self.port)
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self.sampler.run(), name="sampler")
                if self.sources is not None:
                    tg.create_task(self.sources.run(), name="attribution-sources")
                if self.engines is not None:
                    tg.create_task(self.engines.run(), name="engine-scraper")
        finally:
            await asyncio.shield(asyncio.wait_for(runner.cleanup(), timeout=5.0))
            if self.sources is not None:
                await asyncio.shield(asyncio.wait_for(self.sources.close(), timeout=5.0))
            self.backend.close()


    def engine_signals(self) -> dict[tuple[str, str], dict[str, Reading]]:
        """Per-pod engine signals; older than the staleness bound -> UNAVAILABLE."""
        if self.engines is None:
            return {}
        now = time.monotonic()
        out: dict[tuple[str, str], dict[str, Reading]] = {}
        for key, r in self.engines.readings().items():
            stale = now - r.scraped_at > self.sampler.stale_after
            out[key] = {name: Absent.UNAVAILABLE if stale else value
                        for name, value in r.signals.items()}
        return out


async def run_until_signalled(agent: Agent, on_listening: Callable[[int], None]) -> None:
    """Run ``agent`` until SIGTERM or SIGINT, then stop it in order."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    try:
        await agent.run(on_listening)
    except asyncio.CancelledError:
        log.info("stopping on signal")
