"""The agent's root: one task group owns the sampler, attribution sources, the engine
scraper (which owns one task per GPU pod it scrapes, and follows the sampler's latest
attribution for which pods those are), the HTTP server and the telemetry stream.

Start order: backend, registry, sampler, HTTP server, stream server; the HTTP server
listens at once (/healthz answers, /readyz says "no sample yet"). SIGTERM or SIGINT cancel
the group; open streams end, servers stop with bounded timeouts, the backend closes last.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from prometheus_client import CollectorRegistry, disable_created_metrics

from gpuscale.agent.exporter import SnapshotCollector
from gpuscale.agent.http import make_app, start_http
from gpuscale.agent.report import tick
from gpuscale.agent.sampler import Sampler
from gpuscale.attribution.model import NodeAttribution
from gpuscale.attribution.sources import AttributionSources, attribute_tick
from gpuscale.common.grpc_bind import bind, server_options
from gpuscale.common.shutdown import cancel_on_signals
from gpuscale.engines.scrape import MAX_BODY_BYTES, EngineScraper
from gpuscale.proto import telemetry_pb2_grpc as pb_grpc
from gpuscale.stream.publisher import TelemetryPublisher
from gpuscale.stream.records import NodeSink, deliver
from gpuscale.stream.tls import TlsFiles, server_credentials
from gpuscale.telemetry.backend import GpuBackend
from gpuscale.telemetry.model import NodeSnapshot

log = logging.getLogger(__name__)

DEFAULT_METRICS_PORT = 9400  # dcgm-exporter's port, so existing scrape configs keep working


DEFAULT_STREAM_PORT = 9401
# What a subscriber may send: one SubscribeRequest, a name for the logs (cut to 64 there).
# gRPC's default (4 MB) would let each of a connection's 64 streams hold 4 MB for as long
# as it stays open.
STREAM_MAX_REQUEST = 4096


@dataclass(frozen=True)
class AgentConfig:
    host: str = "0.0.0.0"
    port: int = DEFAULT_METRICS_PORT
    interval: float = 1.0
    hostname: str = ""
    stream_port: int | None = None  # telemetry stream for scalers; None: not served
    stream_tls: TlsFiles | None = None  # mTLS for the stream; None: plaintext
    engine_max_body: int = MAX_BODY_BYTES  # largest engine /metrics body read, in bytes


class Agent:
    """Everything one agent process runs, for the CLI and for in-process tests.

    Each tick the sampler's snapshot and attribution, with the engines' latest readings,
    become one ``NodeReport`` (agent.report.tick), handed to the telemetry stream and to
    every sink added."""

    def __init__(self, backend: GpuBackend, config: AgentConfig,
                 sources: AttributionSources | None = None) -> None:
        self.config = config
        self.backend = backend
        self.sources = sources
        disable_created_metrics()  # type: ignore[no-untyped-call]  # *_created: noise here
        self.registry = CollectorRegistry(auto_describe=False)
        self.sampler = Sampler(backend, config.interval, self.registry,
                               attributor=(functools.partial(attribute_tick, sources)
                                           if sources is not None else None))
        # Engines are scraped only for the pods the attribution says hold GPUs here.
        self.engines = (EngineScraper(sources.pod_infos, lambda: self.sampler.attribution,
                                      config.interval, max_body=config.engine_max_body)
                        if sources is not None else None)
        # In Kubernetes the downward API sets NODE_NAME; dcgm-exporter labels by node too.
        self.hostname = (config.hostname or os.environ.get("NODE_NAME")
                         or socket.gethostname())
        self.registry.register(SnapshotCollector(lambda: self.sampler.latest, self.hostname,
                                                 attribution=lambda: self.sampler.attribution))
        self.port: int | None = None
        self.stream_port: int | None = None
        self.publisher = (TelemetryPublisher(self.hostname, config.interval)
                          if config.stream_port is not None else None)
        self._sinks: list[NodeSink] = []
        self.sampler.add_listener(self._on_tick)

    async def run(self, on_listening: Callable[[int], None] | None = None) -> None:
        """Run until cancelled. ``on_listening(port)`` is called once the port is bound."""
        http = await start_http(make_app(self.registry, self.sampler.readiness),
                                self.config.host, self.config.port)
        self.port = http.port
        stream = None
        try:
            if self.publisher is not None:
                stream = grpc.aio.server(options=server_options([
                    ("grpc.max_concurrent_streams", 64),
                    ("grpc.max_receive_message_length", STREAM_MAX_REQUEST)]))
                pb_grpc.add_AgentTelemetryServicer_to_server(self.publisher, stream)  # type: ignore[no-untyped-call]
                address = f"{self.config.host}:{self.config.stream_port}"
                self.stream_port = bind(stream, address,
                                        server_credentials(self.config.stream_tls)
                                        if self.config.stream_tls is not None else None)
                await stream.start()
        except BaseException:  # no server may outlive a failed or cancelled start
            if stream is not None:
                # Cancelled in start() (a demo whose reader went away while a sibling
                # started): unstopped, grpc's __del__ schedules its shutdown on a closed
                # loop and prints a traceback at exit.
                await asyncio.shield(stream.stop(None))
            await asyncio.shield(asyncio.wait_for(http.close(), timeout=5.0))
            raise
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
            if stream is not None and self.publisher is not None:
                self.publisher.stopping.set()
                await asyncio.shield(stream.stop(2.0))
            await asyncio.shield(asyncio.wait_for(http.close(), timeout=5.0))
            if self.sources is not None:
                await asyncio.shield(asyncio.wait_for(self.sources.close(), timeout=5.0))
            self.backend.close()

    def add_sink(self, sink: NodeSink) -> None:
        """After each tick, hand the node's report to ``sink`` (a fleet view in the same
        process: the demo, single-node use) as the subscriber hands a stream's
        (stream.records.deliver), keyed by the node's name: a complete report replaces the
        node's pods and devices; an incomplete one hands nothing, so the sink keeps the
        previous records, which age, and the workloads on this node turn UNAVAILABLE past
        the staleness bound - never a smaller sum."""
        self._sinks.append(sink)

    def _on_tick(self, snap: NodeSnapshot, att: NodeAttribution | None) -> None:
        if self.publisher is None and not self._sinks:
            return
        readings = self.engines.readings() if self.engines is not None else {}
        report = tick(snap, att, readings, time.monotonic(), interval=self.config.interval,
                      node=self.hostname)
        if self.publisher is not None:
            self.publisher.publish_report(report)
        for sink in self._sinks:
            deliver(report, sink, report.node)


async def run_until_signalled(agent: Agent, on_listening: Callable[[int], None]) -> None:
    """Run ``agent`` until SIGTERM or SIGINT, then stop it in order."""
    cancel_on_signals()
    try:
        await agent.run(on_listening)
    except asyncio.CancelledError:
        log.info("stopping on signal")
