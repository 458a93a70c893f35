"""The fault matrix's cluster (bench/fault_matrix.py): three simulated GPU nodes, each agent
reached through a loopback path that can be frozen or cut (tests/peers/netcut.py), a real
vLLM-format /metrics server for one pod's engine, a Prometheus-style query API as a demand
source, and the scaler's subscriber over them. The truth never changes: the pods keep
running whatever happens to their agents."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from gpuscale.agent.app import Agent, AgentConfig
from gpuscale.attribution.model import PodInfo
from gpuscale.attribution.sources import AttributionInputs, ScenarioSources
from gpuscale.engines.simulated_engines import EngineSockets
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.stream.subscriber import AgentSubscriber
from gpuscale.telemetry.model import Absent, NodeSnapshot
from gpuscale.telemetry.scenario import NodeSpec, parse_scenario
from gpuscale.telemetry.simulated_gpus import SimulatedBackend
from tests.peers.netcut import NetPath

ENGINE_IP = "127.1.9.11"
LOADS = {"n0": {"a-0": 30.0, "e-0": 20.0}, "n1": {"a-1": 40.0, "b-0": 25.0},
         "n2": {"b-1": 35.0, "c-0": 15.0}}
WAITING = 7.0


def node_spec(name: str, loads: Mapping[str, float]) -> NodeSpec:
    procs = []
    for i, (pod, load) in enumerate(loads.items()):
        spec: dict[str, Any] = {"namespace": "llm", "name": pod, "container": "c"}
        if pod.startswith("e-"):
            spec["engine"] = "vllm"  # at 127.1.9.11: the second pod of n0 (ip_base .10+k)
        procs.append({"gpu": i, "memory_mib": 1000, "load": {"constant": load}, "pod": spec})
    return parse_scenario({"nodes": [{"name": name, "gpus": [{"model": "L4", "count": 2}],
                                      "processes": procs}]}).nodes[0]


class HiddenPods(ScenarioSources):
    """A node whose pod cache has not synced yet: the kubelet's allocations are there,
    the pods' metadata not (as after an agent's start, before its first pod list)."""

    def __init__(self, node: NodeSpec, engine_port: int) -> None:
        super().__init__(node, ip_base="127.1.9", engine_port=lambda _ip: engine_port)
        self.synced = False

    async def gather(self, snapshot: NodeSnapshot) -> AttributionInputs:
        inputs = await super().gather(snapshot)
        if self.synced:
            return inputs
        return AttributionInputs(inputs.allocations, inputs.allocated_at, Absent.UNAVAILABLE,
                      inputs.owners, ("pod watch: not listed yet",))

    def pod_infos(self) -> Mapping[tuple[str, str], PodInfo] | Absent:
        return super().pod_infos() if self.synced else Absent.UNAVAILABLE


class Engine:
    """A vLLM /metrics at the e-0 pod's IP: ok, dripping, or hostile."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.runner: web.AppRunner | None = None
        self.sockets = EngineSockets()
        self.port = self.sockets.claim(ENGINE_IP)  # free: the matrix runs beside others

    def text(self, waiting: str) -> bytes:
        return (f"# TYPE vllm:num_requests_waiting gauge\n"
                f'vllm:num_requests_waiting{{model_name="m"}} {waiting}\n'
                f"# TYPE vllm:num_requests_running gauge\n"
                f'vllm:num_requests_running{{model_name="m"}} 3\n').encode()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if self.mode == "drip":
            resp = web.StreamResponse()
            await resp.prepare(request)
            with contextlib.suppress(ConnectionError):  # the agent gives up: expected
                for byte in self.text("7"):
                    await resp.write(bytes([byte]))
                    await asyncio.sleep(0.5)
            return resp
        value = {"ok": str(WAITING), "negative": "-43", "nan": "NaN", "huge": "1e300"}
        return web.Response(body=self.text(value[self.mode]), content_type="text/plain")

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self.handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.SockSite(self.runner, self.sockets.take(ENGINE_IP, self.port)).start()


class Queue:
    """A Prometheus query API with pending work, or a hostile reply."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.runner: web.AppRunner | None = None
        self.port = 0

    async def handle(self, _: web.Request) -> web.Response:
        bodies = {"null": b"null", "list": b"[]", "error": b'{"status": "error"}',
                  "negative": b'{"status": "success", "data": {"resultType": "scalar", '
                              b'"result": [0, "-5"]}}'}
        if self.mode in bodies:
            return web.Response(body=bodies[self.mode], content_type="application/json")
        return web.json_response({"status": "success", "data": {
            "resultType": "vector", "result": [{"metric": {}, "value": [0, "3"]}]}})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/api/v1/query", self.handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self.runner.addresses[0][1])


class Cluster:
    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.agents: dict[str, Agent] = {}
        self.paths: dict[str, NetPath] = {}
        self.stream_ports: dict[str, int] = {}
        self.extra: dict[str, str] = {}  # address -> why it is configured (a fault)
        self.fleet = FleetView()
        self.sub = AgentSubscriber(self.fleet, "matrix", backoff_s=(0.05, 0.1))
        self.engine = Engine()
        self.queue = Queue()
        self.hidden: HiddenPods | None = None

    async def start_agent(self, key: str, spec: NodeSpec,
                          sources: ScenarioSources | None = None) -> None:
        port = self.stream_ports.setdefault(key, free_port())
        agent = Agent(SimulatedBackend(spec),
                      AgentConfig("127.0.0.1", 0, self.interval, spec.name, port),
                      sources or ScenarioSources(spec, ip_base="127.1.9",
                                                 engine_port=lambda _ip: self.engine.port))
        bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.tasks[key] = asyncio.create_task(agent.run(bound.set_result))
        await bound
        self.agents[key] = agent

    async def stop_agent(self, key: str) -> None:
        task = self.tasks.pop(key)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    def addresses(self) -> list[str]:
        return [f"127.0.0.1:{p.port}" for p in self.paths.values()] + list(self.extra)

    async def start(self) -> None:
        await self.engine.start()
        await self.queue.start()
        for name, loads in LOADS.items():
            await self.start_agent(name, node_spec(name, loads))
            path = NetPath(self.stream_ports[name])
            await path.start()
            self.paths[name] = path
        self.sub.set_addresses(self.addresses())

    async def stop(self) -> None:
        await self.sub.close()
        for key in list(self.tasks):
            await self.stop_agent(key)
        for p in self.paths.values():
            await p.stop()
        for r in (self.engine.runner, self.queue.runner):
            if r is not None:
                await r.cleanup()


Step = Callable[[Cluster], Awaitable[None]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
