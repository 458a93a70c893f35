"""The simulated world of the live demo: a serving fleet of vLLM replicas, one pod per
replica on simulated 8-GPU nodes, and what each node's agent reads from it (simulated GPU
processes, attribution, engine /metrics at the pods' loopback IPs).

``pods`` runs parallel to the serving model's replicas; each change of the pod set or of a
pod's readiness swaps the nodes' simulated processes and attribution in one go.
"""

from __future__ import annotations

import asyncio
import random
import string
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from aiohttp import web

from gpuscale.attribution.model import PodInfo
from gpuscale.attribution.sources import AttributionInputs, ScenarioSources
from gpuscale.demo.defaults import DEFAULT_SPEED, GPUS_PER_NODE
from gpuscale.engines.simulated_engines import EngineSockets, VllmCounters, vllm_metrics
from gpuscale.engines.vllm_body import unread_families
from gpuscale.models.serving import InFlightRequest, ServingModel, ServingParams
from gpuscale.telemetry.model import Absent, NodeSnapshot
from gpuscale.telemetry.scenario import NodeSpec, PodRef, ProcessSpec, parse_scenario
from gpuscale.telemetry.simulated_gpus import SimulatedBackend
from gpuscale.traffic.trace import TraceRequest

GPU_MODEL = "H100-SXM5-80GB"
NAMESPACE = "llm"
WORKLOAD = "vllm-demo"
POLLING_S = 30.0  # KEDA's default pollingInterval


@dataclass(frozen=True, slots=True)
class LiveConfig:
    requests: Sequence[TraceRequest]
    duration: float  # simulated seconds
    speed: float = DEFAULT_SPEED  # simulated seconds per wall second
    nodes: int = 2
    profile: str = "vllm-planner"
    min_replicas: int = 1
    max_replicas: int = 16
    host: str = "127.0.0.1"
    port: int = 6000
    params: ServingParams = field(default_factory=ServingParams)
    hpa: bool = False  # a plain HPA reads the custom metrics API instead of KEDA's gRPC
    metrics_api_port: int = 0  # with hpa: the local metrics API's port (0: one free)


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
    port: int = 0  # its engine's, claimed free when the pod is created

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
        self.model = ServingModel(cfg.params)
        self.pods: list[Pod] = []
        self.now = 0.0
        self._order = sorted(cfg.requests, key=lambda r: r.arrival_s)
        self._next = 0
        self._seq = 0
        self._signals = self.model.signals(0.0)
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
        self.sockets = EngineSockets()  # the engines' ports, chosen free
    # -- the serving side ---------------------------------------------------------------

    def advance(self, to: float) -> None:
        """Step the serving model in 1 s slices up to simulated time ``to``."""
        while self.now + 1.0 <= to:
            batch = []
            while self._next < len(self._order) and \
                    self._order[self._next].arrival_s < self.now + 1.0:
                r = self._order[self._next]
                batch.append(InFlightRequest(r.arrival_s, r.input_tokens, r.output_tokens))
                self.arrivals.append(r.arrival_s)
                self._next += 1
            self.model.arrive(batch)
            self.model.step(self.now, 1.0)
            self.now += 1.0
        while self.arrivals and self.arrivals[0] < self.now - 60.0:
            self.arrivals.popleft()
        self._signals = self.model.signals(self.now)

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
            pod = Pod(f"{WORKLOAD}-{suffix}", node, gpu, 20_000 + self._seq)
            self.pods.append(replace(pod, port=self.sockets.claim(pod.ip)))
        for gone in self.pods[n:]:
            self.sockets.release(gone.ip, gone.port)  # (not served yet: still starting)
        del self.pods[n:]
        self.model.set_replicas(n, self.now, warm=warm)
        self._signals = self.model.signals(self.now)
        self._ready &= {p.name for p in self.pods}  # new pods turn Ready in mark_ready
        self._publish()

    def _publish(self) -> None:
        for i, base in enumerate(self.base):
            procs = tuple(
                ProcessSpec(p.pid, p.gpu, None, base.gpus[p.gpu].model.memory_mib * 0.9,
                            _DutyCycle(self, p),
                            PodRef(NAMESPACE, p.name, "vllm", engine="vllm", ip=p.ip,
                                   port=p.port, ready=p.name in self._ready))
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
        # The replica's own counters, as its vLLM would count them, divided by the
        # fast-forward: the agent turns them into rates on its wall clock, and these are
        # then the simulated rates (what the planner, on simulated time, expects).
        k = 1.0 / self.cfg.speed
        counters = VllmCounters(k * s.prompt_tokens_total, k * s.generation_tokens_total,
                                k * s.finished_total)
        return vllm_metrics(WORKLOAD, s.running, round(s.waiting), s.kv_cache / 100.0,
                            counters) + unread_families()  # a real engine's size

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

    async def gather(self, snapshot: NodeSnapshot) -> AttributionInputs:
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
                self._runners[name] = await self._world.sockets.serve(
                    pod.ip, pod.port, lambda pod=pod: self._world.engine_text(pod))  # type: ignore[misc]
        self._world.mark_ready([p for p in serving if p in self._world.pods])

    async def close(self) -> None:
        await asyncio.gather(*(r.cleanup() for r in self._runners.values()))
        self._runners.clear()
        self._world.sockets.close()
