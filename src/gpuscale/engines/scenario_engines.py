"""A simulated node's attribution with its inference engines served: ``gpuscale agent
--gpu-backend sim`` advertises the scenario's engine pods (loopback IPs, engine opt-in
annotations) and scrapes them like real pods, so it serves each of those engines too
(engines.simulated_engines: numbers that follow the process's simulated load) - an engine
advertised and not served would read "connection refused" at every scrape and make every
engine profile UNAVAILABLE.

Each engine listens on a port chosen free (several agents on one machine serve theirs side
by side), unless the scenario names the pod's port. A scenario file that is followed may
add, remove or change pods: their engines follow at the next round (every ``interval``),
a pod that stays keeps its engine and its counters.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from aiohttp import web

from gpuscale.attribution.model import PodInfo
from gpuscale.attribution.sources import AttributionInputs, ScenarioSources
from gpuscale.engines.scrape import PORT_ANNOTATION
from gpuscale.engines.simulated_engines import (
    EngineSockets,
    SimulatedEngine,
    engines_for,
    serve_metrics,
)
from gpuscale.telemetry.model import Absent, NodeSnapshot
from gpuscale.telemetry.scenario import NodeSpec

log = logging.getLogger(__name__)

PodKey = tuple[str, str]


def _address(info: PodInfo) -> tuple[str, int]:
    return info.ip, int(dict(info.annotations)[PORT_ANNOTATION])


class ServedScenarioSources:
    """``ScenarioSources`` for ``node()`` (the simulated backend's node as last sampled),
    whose engine pods' ``/metrics`` are served from the first ``gather`` (before any
    attribution, so before the scraper's first request) until ``close``; ``clock``: the
    scenario's time (its loads are curves of it)."""

    def __init__(self, node: Callable[[], NodeSpec], clock: Callable[[], float],
                 interval: float = 1.0) -> None:
        self._node = node
        self._clock = clock
        self._interval = interval
        self._sockets = EngineSockets()
        self._sources = ScenarioSources(node, engine_port=self._sockets.claim)
        self._served: dict[PodKey, tuple[tuple[str, int], SimulatedEngine, web.AppRunner]] = {}
        self._failed: dict[PodKey, tuple[str, int]] = {}  # said once per address
        self._lock = asyncio.Lock()
        self._started = False

    def served(self) -> dict[PodKey, tuple[str, int]]:
        """The pods whose engine is served now, and where."""
        return {key: address for key, (address, _, _) in self._served.items()}

    async def gather(self, snapshot: NodeSnapshot) -> AttributionInputs:
        if not self._started:
            await self.reconcile()
        return await self._sources.gather(snapshot)

    def pod_infos(self) -> Mapping[PodKey, PodInfo] | Absent:
        return self._sources.pod_infos()

    async def run(self) -> None:
        while True:
            await self.reconcile()
            await asyncio.sleep(self._interval)

    async def reconcile(self) -> None:
        """Serve the engines of the node's engine pods; stop those of pods gone or moved."""
        async with self._lock:
            self._started = True
            pods = self._sources.pod_infos()
            if isinstance(pods, Absent):
                return
            loads = {(p.pod.namespace, p.pod.name): p.load
                     for p in self._node().processes if p.pod}
            wanted = {(e.pod.namespace, e.pod.name): e for e in engines_for(dict(pods), loads)}
            for key in [k for k, (address, _, _) in self._served.items()
                        if k not in wanted or _address(wanted[k].pod) != address]:
                await self._served.pop(key)[2].cleanup()
            for key, engine in wanted.items():
                if key in self._served:
                    self._served[key][1].load = engine.load  # a followed file's new curve
                    continue
                await self._serve(key, engine)

    async def _serve(self, key: PodKey, engine: SimulatedEngine) -> None:
        address = _address(engine.pod)
        clock = self._clock

        def render() -> str:
            return engine.render(clock())
        try:
            try:
                runner = await self._sockets.serve(*address, render)
            except KeyError:  # a port the scenario names: not claimed here
                runner = await serve_metrics(*address, render)
        except OSError as exc:
            if self._failed.get(key) != address:
                self._failed[key] = address
                log.warning("%s/%s: cannot serve its simulated engine on %s:%d: %s",
                            *key, *address, exc)
            return
        self._failed.pop(key, None)
        self._served[key] = (address, engine, runner)

    async def close(self) -> None:
        async with self._lock:
            await asyncio.gather(*(runner.cleanup() for _, _, runner in self._served.values()))
            self._served.clear()
            self._sockets.close()
