"""The live closed loop behind ``gpuscale demo``: replicas that follow load through the real
agent and scaler, with KEDA and the HPA modelled on top, all in one process.

    requests (trace or pattern) -> serving model (control/serving.py), one replica per pod
      -> each pod holds one simulated H100 on a simulated node: its duty cycle is the GPU's
         utilization, and its vLLM engine serves /metrics at the pod's loopback IP
      -> one agent per node samples the GPUs, attributes them to the pods, scrapes the
         engines and streams the pods' signals over its telemetry gRPC stream
      -> the scaler (AgentSubscriber + ExternalScaler) on --port (6000)
      -> KEDA + HPA (control/keda.py, control/hpa.py) call GetMetricSpec, GetMetrics and
         IsActive over gRPC, like KEDA's operator, and set the replica count
      -> the serving model adds replicas (cold start: not Ready, no engine yet) or removes
         them (the pod leaves the agents' view at once; its replica drains in the serving
         model for up to 30 s and is billed until then).

Simulated time runs ``speed`` times wall time; the agents, KEDA's polling and the HPA's sync
run on simulated time too, so a fast-forwarded run makes the same decisions as a real-time
one, only sooner. Nothing here reaches into the scaler: it sees pods and numbers exactly as
it would in a cluster.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import string
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import grpc
from aiohttp import web

from gpuscale.agent.app import Agent, AgentConfig
from gpuscale.agent.sampler import MIN_INTERVAL_S
from gpuscale.attribution.model import PodInfo
from gpuscale.attribution.sources import SIM_ENGINE_PORT, Inputs, ScenarioSources
from gpuscale.common.shutdown import cancel_on_signals
from gpuscale.control.hpa import Metric
from gpuscale.control.keda import ScaledObjectLoop, ScaledObjectSpec
from gpuscale.control.serving import Request, ServingFleet, ServingParams
from gpuscale.control.simulate import SLO_TTFT_S, Slo, needed_replicas
from gpuscale.engines.simulated import serve_metrics, vllm_metrics
from gpuscale.proto import externalscaler_pb2 as pb
from gpuscale.proto import externalscaler_pb2_grpc as pb_grpc
from gpuscale.scaler.fleet import FleetView
from gpuscale.scaler.selector import parse_selector
from gpuscale.scaler.service import ScalerServer, ScalerService
from gpuscale.stream.records import PodRecord
from gpuscale.stream.subscriber import AgentSubscriber
from gpuscale.telemetry.load import Request as TraceRequest
from gpuscale.telemetry.model import Absent, NodeSnapshot
from gpuscale.telemetry.scenario import NodeSpec, PodRef, ProcessSpec, parse_scenario
from gpuscale.telemetry.simulated import SimulatedBackend

log = logging.getLogger(__name__)

GPUS_PER_NODE = 8
GPU_MODEL = "H100-SXM5-80GB"
NAMESPACE = "llm"
WORKLOAD = "vllm-demo"
POLLING_S = 30.0  # KEDA's default pollingInterval


@dataclass(frozen=True, slots=True)
class LiveConfig:
    requests: Sequence[TraceRequest]
    duration: float  # simulated seconds
    speed: float = 40.0  # simulated seconds per wall second
    nodes: int = 2
    profile: str = "vllm-inference"
    min_replicas: int = 1
    max_replicas: int = 16
    host: str = "127.0.0.1"
    port: int = 6000
    params: ServingParams = field(default_factory=ServingParams)


class SimClock:
    def __init__(self, speed: float, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.speed = speed
        self._monotonic = monotonic
        self._start = monotonic()

    def now(self) -> float:
        return (self._monotonic() - self._start) * self.speed


@dataclass(frozen=True, slots=True)
class Pod:
    name: str
    node: int
    gpu: int
    pid: int

    @property
    def ip(self) -> str:
        return f"127.{self.node + 1}.0.{10 + self.gpu}"


class _DutyCycle:
    """A process load curve that reads the replica's current duty cycle."""

    def __init__(self, world: World, pod: Pod) -> None:
        self._world, self._pod = world, pod

    def at(self, t: float) -> float:
        return self._world.duty_cycle(self._pod)


class World:
    """The serving fleet, its pods on the simulated nodes, and what each node's agent reads.

    ``pods`` runs parallel to ``fleet.replicas`` (the fleet removes its newest replicas
    first; so do we). Each change of the pod set or of a pod's readiness swaps the nodes'
    simulated processes and attribution in one go."""

    def __init__(self, cfg: LiveConfig) -> None:
        self.cfg = cfg
        self.fleet = ServingFleet(cfg.params)
        self.pods: list[Pod] = []
        self.now = 0.0
        self._order = sorted(cfg.requests, key=lambda r: r.arrival_s)
        self._next = 0
        self._seq = 0
        self._signals = self.fleet.signals(0.0)
        self.arrivals: deque[float] = deque()  # arrival times in the last minute
        scenario = parse_scenario({"description": "live demo", "nodes": [
            {"name": f"gpu-node-{i + 1}", "gpus": [{"model": GPU_MODEL,
                                                     "count": GPUS_PER_NODE}]}
            for i in range(cfg.nodes)]})
        self.base = scenario.nodes
        self.backends = [SimulatedBackend(n) for n in self.base]
        self.sources = [LiveSources(n, f"127.{i + 1}.0") for i, n in enumerate(self.base)]
        self._ready: set[str] = set()
        self.changes = 0

    # -- the serving side ---------------------------------------------------------------

    def advance(self, to: float) -> None:
        """Step the serving model in 1 s slices up to simulated time ``to``."""
        while self.now + 1.0 <= to:
            batch = []
            while self._next < len(self._order) and \
                    self._order[self._next].arrival_s < self.now + 1.0:
                r = self._order[self._next]
                batch.append(Request(r.arrival_s, r.input_tokens, r.output_tokens))
                self.arrivals.append(r.arrival_s)
                self._next += 1
            self.fleet.arrive(batch)
            self.fleet.step(self.now, 1.0)
            self.now += 1.0
        while self.arrivals and self.arrivals[0] < self.now - 60.0:
            self.arrivals.popleft()
        self._signals = self.fleet.signals(self.now)

    def serving(self) -> list[Pod]:
        """Pods whose replica has finished its cold start (their engine should answer)."""
        return [p for p, s in zip(self.pods, self._signals, strict=True) if s.ready]

    def mark_ready(self, pods: list[Pod]) -> None:
        """Pods turn Ready once their engine answers (a readiness probe's view)."""
        ready = {p.name for p in pods}
        if ready != self._ready:
            self._ready = ready
            self._publish()

    def scale(self, n: int, warm: bool = False) -> None:
        """Set the replica count (``warm``: pods already running when the demo opens, not a
        scaling change)."""
        n = max(0, min(n, self.cfg.nodes * GPUS_PER_NODE))
        if n != len(self.pods) and not warm:
            self.changes += 1
        used = {(p.node, p.gpu) for p in self.pods}
        free = [(node, gpu) for node in range(self.cfg.nodes) for gpu in range(GPUS_PER_NODE)
                if (node, gpu) not in used]
        while len(self.pods) < n:
            node, gpu = free.pop(0)
            self._seq += 1
            suffix = "".join(random.Random(self._seq).choices(string.ascii_lowercase, k=5))
            self.pods.append(Pod(f"{WORKLOAD}-{suffix}", node, gpu, 20_000 + self._seq))
        del self.pods[n:]
        self.fleet.set_replicas(n, self.now, warm=warm)
        self._signals = self.fleet.signals(self.now)
        self._ready &= {p.name for p in self.pods}  # new pods turn Ready in mark_ready
        self._publish()

    def _publish(self) -> None:
        for i, base in enumerate(self.base):
            procs = tuple(
                ProcessSpec(p.pid, p.gpu, None, base.gpus[p.gpu].model.memory_mib * 0.9,
                            _DutyCycle(self, p),
                            PodRef(NAMESPACE, p.name, "vllm", engine="vllm", ip=p.ip,
                                   ready=p.name in self._ready))
                for p in self.pods if p.node == i)
            node = NodeSpec(base.name, base.gpus, procs)
            self.backends[i].replace_node(node)
            self.sources[i].replace(node)

    def _index(self, pod: Pod) -> int | None:
        for i, p in enumerate(self.pods):
            if p is pod:
                return i
        return None

    def duty_cycle(self, pod: Pod) -> float:
        i = self._index(pod)
        return self._signals[i].duty_cycle if i is not None else 0.0

    def engine_text(self, pod: Pod) -> str:
        i = self._index(pod)
        if i is None:
            return ""
        s = self._signals[i]
        return vllm_metrics(WORKLOAD, s.running, round(s.waiting), s.kv_cache / 100.0)

    def is_ready(self, pod: Pod) -> bool:
        return pod.name in self._ready

    def ready_count(self) -> int:
        return len(self._ready)

    @property
    def done(self) -> bool:
        return self.now >= self.cfg.duration


class LiveSources:
    """Attribution for one node from the world's current pods (a ScenarioSources swapped
    whenever the pods change)."""

    def __init__(self, node: NodeSpec, ip_base: str) -> None:
        self._ip_base = ip_base
        self._current = ScenarioSources(node, ip_base=ip_base)

    def replace(self, node: NodeSpec) -> None:
        self._current = ScenarioSources(node, ip_base=self._ip_base)

    async def gather(self, snapshot: NodeSnapshot) -> Inputs:
        return await self._current.gather(snapshot)

    async def run(self) -> None:
        await asyncio.Event().wait()

    async def close(self) -> None:
        pass

    def pod_infos(self) -> Mapping[tuple[str, str], PodInfo] | Absent:
        return self._current.pod_infos()


class Engines:
    """Each Ready pod's vLLM /metrics at its IP; a starting pod serves nothing yet (its
    model is loading), a removed one stops."""

    def __init__(self, world: World) -> None:
        self._world = world
        self._runners: dict[str, web.AppRunner] = {}

    async def reconcile(self) -> None:
        """Stop the engines of removed pods, start those of pods done starting, then mark
        those Ready (so the agents never scrape a Ready pod whose engine is not up)."""
        serving = self._world.serving()
        up = {p.name: p for p in serving}
        for name in [n for n in self._runners if n not in up]:
            await self._runners.pop(name).cleanup()
        for name, pod in up.items():
            if name not in self._runners:
                self._runners[name] = await serve_metrics(
                    pod.ip, SIM_ENGINE_PORT, lambda pod=pod: self._world.engine_text(pod))  # type: ignore[misc]
        self._world.mark_ready([p for p in serving if p in self._world.pods])

    async def close(self) -> None:
        await asyncio.gather(*(r.cleanup() for r in self._runners.values()))
        self._runners.clear()


@dataclass
class Decision:
    at: float
    before: int
    after: int
    why: str


@dataclass
class Status:
    """What the view shows; written by the controller."""

    metrics: list[tuple[str, float, float | None]] = field(default_factory=list)
    #   (metric name, target, value or None when the scaler refused)
    active: bool | None = None
    rpc_ms: float = 0.0
    error: str = ""
    decisions: deque[Decision] = field(default_factory=lambda: deque(maxlen=5))


async def control(world: World, clock: SimClock, status: Status, address: str,
                  on_decision: Callable[[Decision], None]) -> None:
    """KEDA's operator and the HPA, as gRPC clients of the scaler."""
    cfg = world.cfg
    ref = pb.ScaledObjectRef(name=WORKLOAD, namespace=NAMESPACE, scalerMetadata={
        "podSelector": f"app={WORKLOAD}", "profile": cfg.profile})
    loop = ScaledObjectLoop(ScaledObjectSpec(polling_s=POLLING_S,
                                             min_replicas=cfg.min_replicas,
                                             max_replicas=cfg.max_replicas))
    loop.warm(clock.now(), len(world.pods))  # the demo opens on a running deployment
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.ExternalScalerStub(channel)  # type: ignore[no-untyped-call]
        while True:  # KEDA retries GetMetricSpec until the scaler answers
            try:
                spec = await stub.GetMetricSpec(ref, timeout=2.0)
                break
            except grpc.aio.AioRpcError as exc:
                status.error = f"GetMetricSpec: {exc.code().name}: {exc.details()}"
                await asyncio.sleep(0.2)
        targets = [(m.metricName, m.targetSizeFloat or float(m.targetSize))
                   for m in spec.metricSpecs]
        while not world.done:
            now = clock.now()
            replicas = len(world.pods)
            if loop.due(now, replicas):
                metrics, status.metrics, status.error = [], [], ""
                began = time.monotonic()
                for name, target in targets:
                    value: float | None = None
                    try:
                        got = await stub.GetMetrics(pb.GetMetricsRequest(
                            scaledObjectRef=ref, metricName=name), timeout=2.0)
                        mv = got.metricValues[0]
                        value = mv.metricValueFloat or float(mv.metricValue)
                    except grpc.aio.AioRpcError as exc:
                        status.error = f"GetMetrics {name}: {exc.code().name}: {exc.details()}"
                    metrics.append(Metric("External", "AverageValue", target, value))
                    status.metrics.append((name, target, value))
                try:
                    status.active = (await stub.IsActive(ref, timeout=2.0)).result
                except grpc.aio.AioRpcError as exc:
                    status.active = None
                    status.error = f"IsActive: {exc.code().name}: {exc.details()}"
                status.rpc_ms = (time.monotonic() - began) * 1000.0
                desired = loop.decide(now, replicas, world.ready_count(), metrics,
                                      status.active)
                if desired != replicas:
                    world.scale(desired)
                    decision = Decision(now, replicas, desired, loop.reason)
                    status.decisions.append(decision)
                    on_decision(decision)
            await asyncio.sleep(0.02)


async def drive(world: World, clock: SimClock, engines: Engines) -> None:
    """Advance the serving model with the clock; start and stop engines as pods change."""
    while not world.done:
        world.advance(min(clock.now(), world.cfg.duration))
        await engines.reconcile()
        await asyncio.sleep(0.02)


def fmt_time(t: float) -> str:
    t = max(0, int(t))
    return f"{t // 3600:02d}:{t % 3600 // 60:02d}:{t % 60:02d}"


@dataclass(frozen=True, slots=True)
class Summary:
    duration: float
    gpu_hours: float
    static_peak: int
    static_gpu_hours: float
    slo_minutes: int
    minutes: int
    p95_ttft_s: float
    changes: int
    max_replicas: int

    def lines(self) -> list[str]:
        saved = 1.0 - self.gpu_hours / self.static_gpu_hours if self.static_gpu_hours else 0.0
        verdict = f"{saved:.0%} saved" if saved >= 0 else f"{-saved:.0%} more"
        return [
            f"simulated {fmt_time(self.duration)}: {self.gpu_hours:.2f} GPU-hours with "
            f"gpuscale vs {self.static_gpu_hours:.2f} provisioned statically at the peak "
            f"({self.static_peak} replicas): {verdict}",
            f"SLO (time to first token <= {SLO_TTFT_S:g} s) missed in {self.slo_minutes} of "
            f"{self.minutes} minutes; p95 TTFT {self.p95_ttft_s:.2f} s; {self.changes} "
            f"scaling changes, at most {self.max_replicas} replicas"]


def summarize(world: World, max_seen: int) -> Summary:
    """Up to where the run got (all of it, unless it was stopped early). Static
    provisioning is the peak of the work the arrivals need (``needed_replicas``), run for
    the whole time; ``gpuscale simulate`` compares against a searched oracle instead."""
    cfg = world.cfg
    ran = max(world.now, 1.0)
    arrived = [r for r in cfg.requests if r.arrival_s < ran]
    plan = needed_replicas(arrived, ran, cfg.params)
    peak = max(plan) if plan else 1
    slo = Slo.of(world.fleet, ran)
    return Summary(ran, world.fleet.gpu_seconds / 3600.0, peak, peak * ran / 3600.0,
                   len(slo.bad_minutes), slo.minutes, slo.p95_ttft_s, world.changes,
                   max_seen)


class View:
    """A screen redrawn in place on a terminal, or log lines (one per decision and one per
    simulated minute) when the output is not a terminal."""

    def __init__(self, world: World, clock: SimClock, status: Status, fleet: FleetView,
                 address: str, tty: bool, out: Callable[[str], None]) -> None:
        self.world, self.clock, self.status, self.fleet = world, clock, status, fleet
        self.address = address
        self.tty = tty
        self._out = out
        self._last_minute = -1
        self.max_seen = len(world.pods)
        self.log_lines: deque[str] = deque(maxlen=4)

    def decision(self, d: Decision) -> None:
        self.max_seen = max(self.max_seen, d.after)
        if not self.tty:
            self._out(f"{fmt_time(d.at)} replicas {d.before} -> {d.after}: {d.why}; "
                      f"{self._metrics_text()}")

    def _metrics_text(self) -> str:
        parts = [f"{name.removeprefix('gpuscale-')} "
                 f"{'UNAVAILABLE' if v is None else f'{v:.0f}'} (target {t:g}/pod)"
                 for name, t, v in self.status.metrics]
        return ", ".join(parts) or "no metric read yet"

    def _load(self) -> tuple[float, int]:
        w = self.world
        return len(w.arrivals) / 60.0, len(w.fleet.queue)

    async def run(self) -> None:
        while True:
            if self.tty:
                self._out("\x1b[H\x1b[2J" + "\n".join(self.screen()))
                await asyncio.sleep(0.25)
            else:
                minute = int(self.world.now // 60)
                if minute != self._last_minute:
                    self._last_minute = minute
                    rate, queue = self._load()
                    self._out(f"{fmt_time(self.world.now)} load {rate:.1f} req/s, queue "
                              f"{queue}, replicas {len(self.world.pods)} "
                              f"({self.world.ready_count()} ready), GPU-hours "
                              f"{self.world.fleet.gpu_seconds / 3600:.2f}")
                await asyncio.sleep(0.1)

    def screen(self) -> list[str]:
        w, s = self.world, self.status
        rate, queue = self._load()
        ready = w.ready_count()
        lines = [
            f"gpuscale demo - closed loop   simulated {fmt_time(w.now)} / "
            f"{fmt_time(w.cfg.duration)}   x{self.clock.speed:g}   Ctrl-C stops",
            "",
            f"load      {rate:7.1f} requests/s (last minute)   queued {queue}",
            f"replicas  {len(w.pods):3d} ({ready} ready, {len(w.pods) - ready} starting)   "
            f"min {w.cfg.min_replicas} max {w.cfg.max_replicas}   GPU-hours "
            f"{w.fleet.gpu_seconds / 3600:.2f}",
            f"scaler    {self.address} profile {w.cfg.profile}: {self._metrics_text()}; "
            f"active {s.active}; {s.rpc_ms:.1f} ms",
        ]
        if s.error:
            lines.append(f"          {s.error[:100]}")
        lines.append("decisions")
        lines += [f"  {fmt_time(d.at)} {d.before} -> {d.after}: {d.why[:90]}"
                  for d in list(s.decisions)[-3:]] or ["  none yet"]
        lines += ["", "pods, as the scaler sees them (GPU from the agents' NVML-style "
                  "readings, requests and KV cache from the engines)",
                  f"  {'pod':<18}{'node':<12}{'GPU util':>9}{'requests':>10}"
                  f"{'KV cache':>10}  state"]
        records: dict[str, PodRecord] = {
            r.name: r for r in self.fleet.select(NAMESPACE, parse_selector(f"app={WORKLOAD}"))}
        for p in w.pods[:16]:
            r = records.get(p.name)
            sig = r.signals if r is not None else {}
            lines.append(f"  {p.name:<18}{w.base[p.node].name:<12}"
                         f"{_num(sig.get('gpu-utilization'), '%'):>9}"
                         f"{_num(sig.get('vllm-requests'), ''):>10}"
                         f"{_num(sig.get('vllm-kv-cache'), '%'):>10}  "
                         f"{'ready' if w.is_ready(p) else 'starting'}")
        if len(w.pods) > 16:
            lines.append(f"  ... and {len(w.pods) - 16} more")
        if self.log_lines:
            lines += ["", "log", *(f"  {line[:110]}" for line in self.log_lines)]
        return lines


def _num(v: object, unit: str) -> str:
    if isinstance(v, Absent):
        return v.value
    if isinstance(v, int | float):
        return f"{v:.0f}{' ' + unit if unit else ''}"
    return "-"


class _ViewLog(logging.Handler):
    def __init__(self, view: View) -> None:
        super().__init__(logging.WARNING)
        self._view = view

    def emit(self, record: logging.LogRecord) -> None:
        self._view.log_lines.append(self.format(record))


async def run_live(cfg: LiveConfig, tty: bool | None = None,
                   out: Callable[[str], None] | None = None) -> Summary:
    """Run the loop for ``cfg.duration`` simulated seconds; returns the summary."""
    tty = sys.stdout.isatty() if tty is None else tty
    write = out or (lambda text: print(text, flush=True))
    if cfg.max_replicas > cfg.nodes * GPUS_PER_NODE:
        raise ValueError(f"max replicas {cfg.max_replicas} do not fit on {cfg.nodes} nodes "
                         f"of {GPUS_PER_NODE} GPUs")
    clock = SimClock(cfg.speed)
    world = World(cfg)
    # What runs when the demo starts: what the first minute's load needs, within bounds.
    first = needed_replicas([r for r in cfg.requests if r.arrival_s < 60.0], 60.0, cfg.params)
    world.scale(min(cfg.max_replicas, max(cfg.min_replicas, first[0])), warm=True)
    interval = min(1.0, max(MIN_INTERVAL_S, 1.0 / cfg.speed))  # ~1 simulated s, <= 5 Hz
    agents = [Agent(b, AgentConfig("127.0.0.1", 0, interval, b.node.name, stream_port=0), s)
              for b, s in zip(world.backends, world.sources, strict=True)]
    fleet = FleetView(stale_after=max(3.0 * interval, 2.0))
    subscriber = AgentSubscriber(fleet, name="demo")
    server = ScalerServer(ScalerService(fleet), host=cfg.host, port=cfg.port)
    address = f"{'localhost' if cfg.host in ('0.0.0.0', '::', '[::]') else cfg.host}:" \
              f"{cfg.port}"
    status = Status()
    view = View(world, clock, status, fleet, address, tty, write)
    engines = Engines(world)
    handler = _ViewLog(view) if tty else None
    if handler is not None:
        logging.getLogger().addHandler(handler)
    waiting = [len(agents) + 1]  # listeners not up yet: the agents' streams and the scaler
    up = asyncio.Event()

    def listening(_port: int) -> None:
        waiting[0] -= 1
        if waiting[0] == 0:
            up.set()

    if tty:
        write(_HIDE_CURSOR)
    cancel_on_signals()  # Ctrl-C or SIGTERM: stop, and still print the summary
    try:
        await engines.reconcile()  # the warm replicas' engines answer from the first scrape
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(a.run(listening), name=f"agent-{a.config.hostname}")
                     for a in agents]
            tasks.append(tg.create_task(server.serve(listening), name="scaler"))
            await up.wait()
            subscriber.set_addresses(f"127.0.0.1:{a.stream_port}" for a in agents)
            if not tty:
                write(f"KEDA external scaler on {address}; {cfg.nodes} simulated nodes of "
                      f"{GPUS_PER_NODE}x {GPU_MODEL}; profile {cfg.profile}; simulated "
                      f"{fmt_time(cfg.duration)} at x{cfg.speed:g}. Ask it what KEDA "
                      f"gets:\n  {grpcurl_hint(address, cfg.profile)}")
            tasks.append(tg.create_task(view.run(), name="view"))
            tasks.append(tg.create_task(
                control(world, clock, status, address, view.decision), name="keda-hpa"))
            await drive(world, clock, engines)
            await subscriber.close()  # before the agents, so no link reports a lost stream
            for t in tasks:
                t.cancel()
    except asyncio.CancelledError:
        log.info("stopping on signal")
    finally:
        if handler is not None:
            logging.getLogger().removeHandler(handler)
        await subscriber.close()
        await engines.close()
        if tty:
            write(_SHOW_CURSOR)
    summary = summarize(world, view.max_seen)
    if tty:
        write("\x1b[H\x1b[2J" + "\n".join(view.screen()))
    write("\n".join(["", *summary.lines()]))
    return summary


_HIDE_CURSOR, _SHOW_CURSOR = "\x1b[?25l", "\x1b[?25h"


def grpcurl_hint(address: str, profile: str) -> str:
    ref = {"scaledObjectRef": {"name": WORKLOAD, "namespace": NAMESPACE, "scalerMetadata": {
        "podSelector": f"app={WORKLOAD}", "profile": profile}}}
    return (f"grpcurl -plaintext -d '{json.dumps(ref)}' {address} "
            "externalscaler.ExternalScaler/GetMetricSpec")

