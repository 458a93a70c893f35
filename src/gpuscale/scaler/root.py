"""The scaler as one object: ``Scaler`` owns the fleet view, the agent subscriber, the
rosters, the workload resolver, the demand sources, the plan book, the answer function, the
KEDA and Inspect services, the history recorder, the HTTP endpoints and any component
served beside them (the custom metrics API), and runs them in one task group.

``gpuscale scaler`` builds it from the command line; both demos and the tests build the
same object from a ``ScalerConfig``. Run two or more replicas; none leads. Each discovers
the agents (a static list, or the EndpointSlices of the agents' headless Service),
subscribes to all of them, and answers KEDA from its own fleet view - the same inputs give
every replica the same answers.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram

from gpuscale.common.errors import ConfigError
from gpuscale.common.shutdown import cancel_on_signals
from gpuscale.scaler.advisory import Advisor
from gpuscale.scaler.answers import Answers
from gpuscale.scaler.config import ScalerConfig
from gpuscale.scaler.edges.http import (
    AdvisoryCollector,
    AgentsCollector,
    FrontCollector,
    PlanCollector,
    ScalerHttp,
    StreamsCollector,
)
from gpuscale.scaler.edges.inspect import SERVICE as INSPECT
from gpuscale.scaler.edges.inspect import Inspector
from gpuscale.scaler.edges.inspect import add_to_server as add_inspect
from gpuscale.scaler.edges.keda import ScalerServer, ScalerService
from gpuscale.scaler.edges.keda import add_to_server as add_keda
from gpuscale.scaler.edges.relay_backend import RelayBackend
from gpuscale.scaler.edges.relay_supervisor import Front
from gpuscale.scaler.recorder import Recorder
from gpuscale.scaler.sources.demand import DemandSources
from gpuscale.scaler.sources.roster import AgentRoster, PodRoster, Roster
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.scaler.state.plan_book import PlanBook
from gpuscale.scaler.state.streams import RELAYED_STREAM_BYTES, STREAM_BYTES, StreamBook
from gpuscale.stream.subscriber import AgentSubscriber
from gpuscale.stream.tls import channel_credentials, server_credentials

if TYPE_CHECKING:  # the Kubernetes client loads only when the API is used
    from gpuscale.kube.api import KubeApi
    from gpuscale.scaler.sources.workloads import WorkloadResolver
    from gpuscale.stream.discovery import EndpointSliceDiscovery

log = logging.getLogger(__name__)

WARMUP_S = 15.0  # with the pod roster: how long /readyz waits for every agent to report
SWEEP_S = 10.0  # departed agents' links are forgotten this often
# Python's cyclic collector, for the scaler process: a young generation of 700 objects
# (the default) ran ~6 collections a second of ~3 ms each at 1,000 agents and 1,000
# ScaledObjects, with a 20 ms second generation every 2 s and a 100-200 ms full one every
# ~15 s; most objects here die by reference count, so a larger young generation collects
# rarely (bench_keda; gpuscale_scaler_gc_pause_seconds shows it live).
GC_THRESHOLDS: tuple[int, int, int] = (50_000, 20, 100)


class Component(Protocol):
    """Something served beside the KEDA service from the same scaler (the metrics API)."""

    async def run(self, scaler: Scaler) -> None: ...


class Scaler:
    def __init__(self, config: ScalerConfig, api: KubeApi | None = None,
                 components: Sequence[Component] = ()) -> None:
        """``api``: the Kubernetes API, needed when ``config.uses_api`` or a component
        needs it (the caller connects and closes it)."""
        if config.uses_api and api is None:
            raise ConfigError("this configuration needs the Kubernetes API (in-cluster "
                              "credentials or --kubeconfig)")
        self.config = config
        self.api = api
        self.components = tuple(components)
        self.fleet = FleetView(stale_after=config.stale_after_s)
        self.registry = CollectorRegistry(auto_describe=False)
        self.subscriber: AgentSubscriber | None = None
        self.discovery: EndpointSliceDiscovery | None = None
        self.agent_roster: AgentRoster | None = None
        self.pod_roster: PodRoster | None = None
        roster: Roster | None = None
        if not config.in_process:
            roster = self._subscribe(config, api)
        self.resolver: WorkloadResolver | None = None
        if api is not None and config.resolve_targets:
            from gpuscale.scaler.sources.workloads import WorkloadResolver

            self.resolver = WorkloadResolver(api)
        self.demand = DemandSources(config.demand)
        self.answers = Answers(self.fleet, roster, self.resolver,
                               PlanBook(time_scale=config.time_scale), self.demand.pending,
                               startups=self.pod_roster)
        requests = Counter("gpuscale_scaler_requests", "KEDA calls answered, by method and "
                           "gRPC status (UNAVAILABLE: missing or stale data).",
                           ["method", "code"], registry=self.registry)
        self.service = ScalerService(self.answers,
                                     count=lambda m, c: requests.labels(m, c).inc(),
                                     streams=StreamBook(
                                         config.stream_memory_mib * 2**20,
                                         RELAYED_STREAM_BYTES if config.answer_process
                                         else STREAM_BYTES))
        self.registry.register(PlanCollector(self.answers.plans))
        self.registry.register(StreamsCollector(self.service.streams))
        self.advisor = (Advisor(self.answers, config.advisory, self.fleet.now,
                                history=self.service.history)
                        if config.advisory else None)
        if self.advisor is not None:
            self.registry.register(AdvisoryCollector(self.advisor))
        self.recorder = Recorder(self.answers, self.service.history,
                                 self.subscriber.states if self.subscriber else None,
                                 step_s=config.history_step_s)
        self.inspector = Inspector(self.recorder, self.resolver, self.advisor)
        # KEDA's port: served here, or (answer_process) by a child that relays each call
        self.server = None if config.answer_process else ScalerServer(
            self.service, host=config.host, port=config.port,
            credentials=server_credentials(config.tls) if config.tls else None,
            extra=[(INSPECT, lambda s: add_inspect(self.inspector, s))])
        self.front: Front | None = None  # with answer_process, while it runs
        self._gc_pause = Histogram(
            "gpuscale_scaler_gc_pause_seconds", "Python's cyclic garbage collections, by "
            "generation: each one stops every answer for this long.", ["generation"],
            buckets=(0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0),
            registry=self.registry)
        self._gc_started = 0.0
        self.http = (ScalerHttp(self.registry, self.readiness, config.host,
                                config.metrics_port)
                     if config.metrics_port is not None else None)
        self._started: float | None = None

    def _subscribe(self, config: ScalerConfig, api: KubeApi | None) -> Roster:
        delay = Histogram("gpuscale_scaler_update_delay_seconds",
                          "From an agent's sample (its wall clock) to the update reaching "
                          "this scaler; includes clock skew between the nodes.",
                          buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0),
                          registry=self.registry)
        creds = channel_credentials(config.agent_tls) if config.agent_tls else (lambda: None)
        sub = self.subscriber = AgentSubscriber(
            self.fleet, name=config.name, credentials=creds,
            server_name=config.agent_tls_server_name, on_delay=delay.observe)
        if config.agent_service:
            from gpuscale.stream.discovery import EndpointSliceDiscovery

            assert api is not None
            ns, _, name = config.agent_service.partition("/")
            self.discovery = EndpointSliceDiscovery(api, ns, name, sub.set_addresses,
                                                    default_port=config.agent_port)
        else:
            sub.set_addresses(config.agents)
        self.registry.register(AgentsCollector(sub, self.fleet))
        agents = self.agent_roster = AgentRoster(sub)
        if api is not None:
            self.pod_roster = PodRoster(api, agents)
            return self.pod_roster
        return agents

    @property
    def port(self) -> int:
        """The KEDA port, once bound (at construction; with the answer process, once its
        front listens)."""
        if self.server is not None:
            return self.server.port
        return self.front.port if self.front is not None else 0

    @property
    def plans(self) -> PlanBook:
        return self.answers.plans

    def readiness(self) -> tuple[bool, str]:
        """Static agents: ready once every configured agent has delivered a complete
        update (before that no answer could be OK). With the API: once the running pods
        are listed, and every discovered agent has reported or a warm-up of WARMUP_S has
        passed (the pod roster then names the silent ones per workload, so one dead agent
        does not keep every replica out of the Service)."""
        roster = self.pod_roster or self.agent_roster
        ok, line = roster.ready() if roster is not None else (True, "agents in process")
        loop = asyncio.get_running_loop()
        if (ok and self.pod_roster is not None and self.agent_roster is not None
                and (self._started is None or loop.time() - self._started < WARMUP_S)):
            ok, line = self.agent_roster.ready()
        return ok, f"{line}, {self.fleet.pod_count()} pods"

    async def run(self, on_listening: Callable[[int], None] | None = None) -> None:
        """Serve until cancelled (or until a task fails); then stop in order."""
        self._started = asyncio.get_running_loop().time()
        front, http = None, None
        gc.callbacks.append(self._on_gc)
        try:
            if self.server is None:  # KEDA's port in a child (scaler.edges.relay)
                front = self.front = Front(RelayBackend([
                    lambda s: add_keda(self.service, s),
                    lambda s: add_inspect(self.inspector, s)]))
                config = self.config
                await front.start(  # OSError: "cannot listen"
                    config.host if config.host.startswith("unix:")
                    else f"{config.host}:{config.port}",
                    config.tls, ScalerServer.options(self.service))
                self.registry.register(FrontCollector(front))
            if self.http is not None:
                await self.http.start()
                http = self.http
            async with asyncio.TaskGroup() as tg:
                if self.server is not None:
                    tg.create_task(self.server.serve(on_listening), name="keda-service")
                else:
                    assert front is not None
                    tg.create_task(front.watch(), name="keda-front")
                    if on_listening is not None:
                        on_listening(front.port)
                tg.create_task(self.demand.run(), name="demand-sources")
                tg.create_task(self.plans.run(self.fleet.now, self.service.stopping),
                               name="planner")
                tg.create_task(self.recorder.run(), name="history")
                if self.advisor is not None:
                    tg.create_task(self.advisor.run(), name="advisory")
                if self.subscriber is not None:
                    tg.create_task(self._sweep(self.subscriber), name="sweep")
                for task in (self.resolver, self.pod_roster, self.discovery):
                    if task is not None:
                        tg.create_task(task.run())
                for component in self.components:
                    tg.create_task(component.run(self))
        finally:
            gc.callbacks.remove(self._on_gc)
            if self.server is not None and not self.server.serving:
                # Bound at construction: stopped here when the serving task was cancelled
                # before its first step (unstopped, grpc's __del__ prints a traceback once
                # the loop has closed). Once serve() began it stops the server itself: a
                # second stop beside its own never returned, and a demo whose metrics API
                # could not listen hung instead of saying so.
                await asyncio.shield(self.server.stop(0))
            if front is not None:
                await front.stop(self.service.stopping)
            if self.subscriber is not None:
                await self.subscriber.close()
            if http is not None:
                await http.stop()

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self._gc_pause.labels(str(info["generation"])).observe(
                time.perf_counter() - self._gc_started)

    @staticmethod
    async def _sweep(subscriber: AgentSubscriber) -> None:
        while True:
            await asyncio.sleep(SWEEP_S)
            subscriber.sweep()


def gc_thresholds(given: str) -> tuple[int, int, int]:
    """The collector's thresholds: GC_THRESHOLDS, or ``given`` ("700,10,10": Python's
    defaults) from GPUSCALE_GC_THRESHOLDS. ConfigError for anything but three positive
    integers."""
    if not given:
        return GC_THRESHOLDS
    try:
        parts = [int(v) for v in given.split(",")]
    except ValueError:
        parts = []
    if len(parts) != 3 or min(parts) < 1:
        raise ConfigError(f"GPUSCALE_GC_THRESHOLDS: {given[:40]!r} is not three positive "
                          f"integers (e.g. 700,10,10)")
    return parts[0], parts[1], parts[2]


def tune_gc() -> None:
    """For a long-running scaler process (not the tests or demos that build a Scaler):
    what start-up made (modules, the configuration) is moved out of the collector's way,
    and the young generation is made large (gc_thresholds)."""
    thresholds = gc_thresholds(os.environ.get("GPUSCALE_GC_THRESHOLDS", ""))
    gc.collect()
    gc.freeze()
    gc.set_threshold(*thresholds)


async def serve(config: ScalerConfig, components: Sequence[Component] = (),
                needs_api: bool = False) -> None:
    """``gpuscale scaler``: connect to the API when needed, run until cancelled (SIGTERM or
    Ctrl-C), close. ``needs_api``: a component needs the API even if the configuration
    alone does not."""
    api = None
    if config.uses_api or needs_api:
        from gpuscale.kube.connect import connect

        api = await connect(config.kubeconfig)
    try:
        scaler = Scaler(config, api, components)
        tune_gc()
        cancel_on_signals()
        await scaler.run(lambda port: print(
            f"gpuscale scaler on {config.host}:{port}, metrics on :{config.metrics_port}, "
            f"agents: {config.agents_text()}", flush=True))
    except asyncio.CancelledError:
        log.info("stopping on signal")
    finally:
        if api is not None:
            await api.close()
