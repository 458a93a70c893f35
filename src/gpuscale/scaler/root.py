"""``gpuscale scaler``: the KEDA external scaler fed by every agent's telemetry stream.

Run two or more replicas; none leads. Each discovers the agents (a static list, or the
EndpointSlices of the agents' headless Service), subscribes to all of them, and answers
KEDA from its own fleet view - the same inputs give every replica the same answers.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import sys
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuscale.common.errors import ConfigError
from gpuscale.common.shutdown import cancel_on_signals
from gpuscale.scaler.edges.inspect import SERVICE as INSPECT
from gpuscale.scaler.edges.inspect import Inspector
from gpuscale.scaler.edges.inspect import add_to_server as add_inspect
from gpuscale.scaler.edges.keda import ScalerServer, ScalerService
from gpuscale.scaler.sources.demand import DemandConfig, DemandSources, load_config
from gpuscale.scaler.sources.roster import AgentRoster, PodRoster, Roster
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.scaler.state.history import STEP_S
from gpuscale.scaler.state.plan_book import PlanBook
from gpuscale.stream.subscriber import AgentSubscriber
from gpuscale.stream.tls import channel_credentials, server_credentials

if TYPE_CHECKING:  # the Kubernetes client loads only when the API is used
    from gpuscale.kube.api import KubeApi
    from gpuscale.scaler.sources.workloads import WorkloadResolver

log = logging.getLogger(__name__)

WARMUP_S = 15.0


def loop_time() -> float:
    return asyncio.get_running_loop().time()


class ScalerCollector(Collector):
    """Per-agent connection state and data age, rendered on every scrape."""

    def __init__(self, subscriber: AgentSubscriber, fleet: FleetView) -> None:
        self._sub = subscriber
        self._fleet = fleet

    def collect(self) -> Iterable[Metric]:
        up = GaugeMetricFamily("gpuscale_scaler_agent_connected",
                               "1 while the agent's stream delivers updates.",
                               labels=["address", "node"])
        age = GaugeMetricFamily("gpuscale_scaler_agent_data_age_seconds",
                                "Seconds since the agent's last update arrived.",
                                labels=["address", "node"])
        reconnects = CounterMetricFamily("gpuscale_scaler_agent_reconnects",
                                         "Stream reconnections per agent.", labels=["address"])
        sources = self._fleet.nodes()  # keyed by the address each stream was dialled at
        for s in self._sub.states():
            up.add_metric([s.address, s.identity], 1.0 if s.connected else 0.0)
            if s.address in sources:
                age.add_metric([s.address, s.identity], sources[s.address])
            reconnects.add_metric([s.address], float(s.reconnects))
        pods = GaugeMetricFamily("gpuscale_scaler_fleet_pods", "Pods in the fleet view.")
        pods.add_metric([], float(self._fleet.pod_count()))
        return [up, age, reconnects, pods]


class PlanCollector(Collector):
    """Every planned workload's plan and the terms it came from (scaler.planner)."""

    def __init__(self, plans: PlanBook) -> None:
        self._plans = plans

    def collect(self) -> Iterable[Metric]:
        labels = ["namespace", "scaledobject"]
        replicas = GaugeMetricFamily("gpuscale_plan_replicas", "The planner's replica count "
                                     "(what KEDA's HPA is asked for).", labels=labels)
        terms = GaugeMetricFamily(
            "gpuscale_plan_term", "The planner's terms, in replicas (steady, burst, "
            "concurrency, kv, backlog, required), replica-seconds (arrived: work that "
            "arrived in the last second; request_work: of one request) or pods (ready, "
            "starting).", labels=[*labels, "term"])
        for (namespace, name), plan in self._plans.plans():
            replicas.add_metric([namespace, name], float(plan.replicas))
            for term, value in plan.terms().items():
                terms.add_metric([namespace, name, term], value)
        return [replicas, terms]


@dataclass(frozen=True)
class Parts:
    """What a component served beside the KEDA service (the metrics API) reads."""

    fleet: FleetView
    roster: Roster
    workloads: WorkloadResolver | None
    plans: PlanBook
    api: KubeApi | None
    registry: CollectorRegistry  # the scaler's /metrics


Extra = Callable[[Parts], Coroutine[Any, Any, None]]


async def serve(args: argparse.Namespace, extras: Sequence[Extra] = (),
                needs_api: bool = False) -> None:
    """Run the scaler until cancelled, with ``extras`` (each a long-running task over the
    scaler's parts) in the same task group. ``needs_api``: an extra needs the Kubernetes
    API (and the workloads' selectors from it) even without --agent-service or
    --resolve-targets."""
    fleet = FleetView()
    creds = channel_credentials(args.agent_tls) if args.agent_tls else (lambda: None)
    registry = CollectorRegistry(auto_describe=False)
    delay = Histogram("gpuscale_scaler_update_delay_seconds",
                      "From an agent's sample (its wall clock) to the update reaching this "
                      "scaler; includes clock skew between the nodes.",
                      buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0),
                      registry=registry)
    subscriber = AgentSubscriber(fleet, name=socket.gethostname(), credentials=creds,
                                 server_name=args.agent_tls_server_name,
                                 on_delay=delay.observe)
    config = load_config(args.config) if args.config else DemandConfig()
    demand = DemandSources(config)
    api = None
    workloads = None
    discovery = None
    if args.agent_service or args.resolve_targets or needs_api:
        from gpuscale.kube.connect import connect

        api = await connect(args.kubeconfig)
    if (args.resolve_targets or needs_api) and api is not None:
        from gpuscale.scaler.sources.workloads import WorkloadResolver

        workloads = WorkloadResolver(api)
    if args.agent_service:
        from gpuscale.stream.discovery import EndpointSliceDiscovery

        ns, _, name = args.agent_service.partition("/")
        assert api is not None
        discovery = EndpointSliceDiscovery(api, ns, name, subscriber.set_addresses,
                                           default_port=args.agent_port)
    else:
        subscriber.set_addresses(args.agents)
    agents = AgentRoster(subscriber)
    pod_roster = PodRoster(api, agents) if api is not None else None
    roster: Roster = pod_roster if pod_roster is not None else agents

    registry.register(ScalerCollector(subscriber, fleet))
    requests = Counter("gpuscale_scaler_requests", "KEDA calls answered, by method and gRPC "
                       "status (UNAVAILABLE: missing or stale data).",
                       ["method", "code"], registry=registry)
    service = ScalerService(fleet, demand=demand.pending, workloads=workloads,
                            count=lambda m, c: requests.labels(m, c).inc(), roster=roster)
    registry.register(PlanCollector(service.plans))
    inspector = Inspector(service, subscriber.states, workloads,
                          step_s=getattr(args, "history_step", STEP_S))
    server = ScalerServer(service,
                          host=args.host, port=args.port,
                          credentials=server_credentials(args.tls) if args.tls else None,
                          extra=[(INSPECT, lambda s: add_inspect(inspector, s))])

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), content_type="text/plain")

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    started = loop_time()

    async def readyz(_: web.Request) -> web.Response:
        """Static agents: ready once every configured agent has delivered a complete
        update (before that no answer could be OK). With the API: once the running pods
        are listed, and every discovered agent has reported or a warm-up of WARMUP_S has
        passed (the pod roster then names the silent ones per workload, so one dead agent
        does not keep every replica out of the Service)."""
        ok, line = roster.ready()
        if ok and pod_roster is not None and loop_time() - started < WARMUP_S:
            ok, line = agents.ready()
        return web.Response(text=f"{'ok' if ok else 'not ready'}: {line}, "
                                 f"{fleet.pod_count()} pods\n", status=200 if ok else 503)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, args.host, args.metrics_port).start()

    async def sweep() -> None:
        while True:
            await asyncio.sleep(10)
            subscriber.sweep()

    cancel_on_signals()
    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(server.serve(lambda port: print(
                f"gpuscale scaler on {args.host}:{port}, metrics on :{args.metrics_port}, "
                f"agents: {args.agent_service or ', '.join(args.agents)}", flush=True)))
            tg.create_task(demand.run())
            tg.create_task(sweep())
            tg.create_task(service.plan_loop())
            tg.create_task(inspector.record())
            if workloads is not None:
                tg.create_task(workloads.run())
            if pod_roster is not None:
                tg.create_task(pod_roster.run())
            if discovery is not None:
                tg.create_task(discovery.run())
            parts = Parts(fleet, roster, workloads, service.plans, api, registry)
            for extra in extras:
                tg.create_task(extra(parts))
    except asyncio.CancelledError:
        log.info("stopping on signal")
    finally:
        await subscriber.close()
        await runner.cleanup()
        if api is not None:
            await api.close()


def run_scaler(args: argparse.Namespace, extras: Sequence[Extra] = (),
               needs_api: bool = False) -> int:
    if not args.agents and not args.agent_service:
        print("gpuscale: give --agents HOST:PORT,... or --agent-service NAMESPACE/NAME",
              file=sys.stderr)
        return 2
    if args.agent_tls is None and not args.agents_insecure:
        print("gpuscale: agent streams need --agent-tls-cert, --agent-tls-key and "
              "--agent-tls-ca (mutual TLS), or --agents-insecure", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(args, extras, needs_api))
    except ConfigError as exc:
        print(f"gpuscale: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"gpuscale: {exc}", file=sys.stderr)
        return 1
    return 0
