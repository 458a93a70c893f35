"""The scaler's HTTP side: Prometheus ``/metrics`` (rendered on every scrape from what the
scaler holds), ``/healthz`` and ``/readyz``."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuscale.scaler.advisory import Advisor
from gpuscale.scaler.core.planner import CUT_SHARE
from gpuscale.scaler.edges.http_guard import BoundedServer, Bounds
from gpuscale.scaler.edges.relay_supervisor import Front
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.scaler.state.plan_book import PlanBook
from gpuscale.scaler.state.streams import KINDS, StreamBook
from gpuscale.stream.subscriber import AgentSubscriber

Readiness = Callable[[], tuple[bool, str]]  # (ready, a line for a person)


class AgentsCollector(Collector):
    """Per-agent connection state and data age, and the fleet view's size."""

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


class StreamsCollector(Collector):
    """KEDA's open streams against their budget (scaler.state.streams)."""

    def __init__(self, streams: StreamBook) -> None:
        self._streams = streams

    def collect(self) -> Iterable[Metric]:
        book = self._streams
        open_ = GaugeMetricFamily("gpuscale_scaler_streams", "KEDA's open streams, by "
                                  "method.", labels=["method"])
        for kind in KINDS:
            open_.add_metric([kind], float(book.count(kind)))
        used = GaugeMetricFamily("gpuscale_scaler_stream_bytes", "Memory the open streams "
                                 "are counted as holding, of the budget.", labels=["of"])
        used.add_metric(["used"], float(book.bytes))
        used.add_metric(["budget"], float(book.budget_bytes))
        ended = CounterMetricFamily(
            "gpuscale_scaler_streams_ended", "Streams ended by the scaler: replaced (a "
            "newer stream of the same trigger took its place) or refused (over the "
            "budget).", labels=["why"])
        ended.add_metric(["replaced"], float(book.replaced))
        ended.add_metric(["refused"], float(book.refused))
        return [open_, used, ended]


class FrontCollector(Collector):
    """The gRPC front's own figures (``--answer-process``: KEDA's port in a child
    process), from its latest answer to the fleet process's pings."""

    def __init__(self, front: Front) -> None:
        self._front = front

    def collect(self) -> Iterable[Metric]:
        silent = GaugeMetricFamily(
            "gpuscale_front_silent_seconds", "Seconds since the gRPC front last answered "
            "the fleet process's ping (it is killed, and the scaler ends, past "
            f"{self._front.wedged_s:g}).")
        silent.add_metric([], self._front.silent_s())
        out: list[Metric] = [silent]
        stats = self._front.backend.stats
        if stats is not None:
            cpu = CounterMetricFamily("gpuscale_front_cpu_seconds",
                                      "User and system CPU the gRPC front has used.")
            cpu.add_metric([], stats.cpu_s)
            rss = GaugeMetricFamily("gpuscale_front_resident_memory_bytes",
                                    "The gRPC front's resident memory.")
            rss.add_metric([], float(stats.rss_bytes))
            runs = CounterMetricFamily("gpuscale_front_gc_collections", "The gRPC front's "
                                       "cyclic garbage collections.", labels=["generation"])
            for generation, count in enumerate(stats.collections):
                runs.add_metric([str(generation)], float(count))
            out += [cpu, rss, runs]
        return out


class PlanCollector(Collector):
    """Every planned workload's plan and the terms it came from (scaler.core.planner)."""

    def __init__(self, plans: PlanBook) -> None:
        self._plans = plans

    def collect(self) -> Iterable[Metric]:
        labels = ["namespace", "scaledobject"]
        replicas = GaugeMetricFamily("gpuscale_plan_replicas", "The planner's replica count "
                                     "(what KEDA's HPA is asked for).", labels=labels)
        terms = GaugeMetricFamily(
            "gpuscale_plan_term",
            "The planner's terms, in replicas (steady, burst, concurrency, kv, backlog, required,"
            " unheld: ceil(required)), replica-seconds (arrived: work that arrived in the last "
            "second; request_work: of one request; growth: the load's growth over a start-up, "
            "inside steady; joined: the decode of sequences that joined the batches this "
            "minute, counted at once, inside steady; burst_excess: the remembered burst's "
            "excess over its level, inside burst; capacity: the fraction of the configured a "
            "Ready pod delivers; "
            "batch_capacity: what a full KV cache's batch allows, inside capacity), KV-cache "
            "percent points (kv_growth: the fill over a start-up, inside kv), seconds (startup: "
            "the start-up planned with, configured or measured from the pods; request_s: how long"
            " a request runs, NaN before a minute is seen) or pods (ready, starting; "
            "startup_pods: the pods it was measured over, 0 when configured or the default; held:"
            " the load's own count, which the hold keeps; "
            f"drain_floor: the Ready pods kept so a scale-down cuts at most {CUT_SHARE:.0%} of a"
            f" minute's requests, 0 when it does not bind).",
            labels=[*labels, "term"])
        for (namespace, name), plan in self._plans.plans():
            replicas.add_metric([namespace, name], float(plan.replicas))
            for term, value in plan.terms().items():
                terms.add_metric([namespace, name, term], value)
        return [replicas, terms]


class AdvisoryCollector(Collector):
    """The advisory plans on ``/metrics``, rendered from the ledgers as they are."""

    def __init__(self, advisor: Advisor) -> None:
        self._advisor = advisor

    def collect(self) -> Iterable[Metric]:
        labels = ["namespace", "name"]
        replicas = GaugeMetricFamily(
            "gpuscale_advisory_replicas", "An advisory workload's replicas now: planned by "
            "gpuscale, actual (its pods); absent while not known.",
            labels=[*labels, "kind"])
        hours = GaugeMetricFamily(
            "gpuscale_advisory_gpu_hours", "GPU-hours over the last 24 h, in the seconds "
            "both counts were known: planned by gpuscale, actual.", labels=[*labels, "kind"])
        saved = GaugeMetricFamily(
            "gpuscale_advisory_saved_gpu_hours", "Actual less planned GPU-hours over the "
            "last 24 h, in the seconds both were known (negative: the plan costs more).",
            labels=labels)
        known = GaugeMetricFamily(
            "gpuscale_advisory_known_seconds", "Seconds of the last 24 h in which both "
            "counts were known (what the GPU-hours cover).", labels=labels)
        unknown = GaugeMetricFamily(
            "gpuscale_advisory_unknown_seconds", "Seconds of the last 24 h in which the "
            "plan or the pods were not known (left out, never counted as 0).", labels=labels)
        for (namespace, name), ledger in self._advisor.state().items():
            ids = [namespace, name]
            if ledger.planned is not None:
                replicas.add_metric([*ids, "planned"], float(ledger.planned))
            if ledger.actual is not None:
                replicas.add_metric([*ids, "actual"], float(ledger.actual))
            seconds, planned, actual, missing = ledger.totals()
            hours.add_metric([*ids, "planned"], planned)
            hours.add_metric([*ids, "actual"], actual)
            saved.add_metric(ids, actual - planned)
            known.add_metric(ids, seconds)
            unknown.add_metric(ids, missing)
        return [replicas, hours, saved, known, unknown]


# Who reads the scaler's /metrics: Prometheus (a few servers), the kubelet's probes, a
# person with curl. A scrape's head is well under 8 KiB (a bearer token included).
MAX_CONNECTIONS = 64
MAX_HEAD_BYTES = 32 * 1024
MAX_HEADERS = 32


class ScalerHttp:
    """``/metrics`` from ``registry``, ``/healthz``, and ``/readyz`` from ``readiness``;
    GET only. Connections bounded (scaler.edges.http_guard): at most MAX_CONNECTIONS, each
    request head at most MAX_HEAD_BYTES and HEAD_TIMEOUT_S to arrive."""

    def __init__(self, registry: CollectorRegistry, readiness: Readiness, host: str,
                 port: int) -> None:
        self._registry = registry
        self._readiness = readiness
        self._host, self._port = host, port
        self._routes: dict[str, Callable[[], web.Response]] = {
            "/metrics": self._metrics, "/healthz": self._healthz, "/readyz": self._readyz}
        self.bounds = Bounds(MAX_CONNECTIONS, MAX_HEAD_BYTES)
        self._runner = web.ServerRunner(BoundedServer(
            self._handle, self.bounds, access_log=None, max_headers=MAX_HEADERS))

    async def start(self) -> None:
        await self._runner.setup()
        await web.TCPSite(self._runner, self._host, self._port).start()

    async def stop(self) -> None:
        await self._runner.cleanup()

    async def _handle(self, request: web.BaseRequest) -> web.Response:
        route = self._routes.get(request.path)
        if route is None:
            return web.Response(status=404, text="404: Not Found\n")
        if request.method not in ("GET", "HEAD"):
            return web.Response(status=405, text="405: Method Not Allowed\n",
                                headers={"Allow": "GET"})
        return route()

    def _metrics(self) -> web.Response:
        return web.Response(body=generate_latest(self._registry), content_type="text/plain")

    def _healthz(self) -> web.Response:
        return web.Response(text="ok\n")

    def _readyz(self) -> web.Response:
        ok, line = self._readiness()
        return web.Response(text=f"{'ok' if ok else 'not ready'}: {line}\n",
                            status=200 if ok else 503)
