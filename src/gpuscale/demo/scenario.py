"""``gpuscale demo --scenario``: a static simulated fleet end to end in one process.

One agent per scenario node (simulated GPUs, attribution from the scenario, /metrics on
its own port), simulated inference engines at the pods' loopback IPs (scraped by the
agents like real pods), all feeding one fleet view, and the KEDA external scaler on :6000
answering from it. SIGTERM or Ctrl-C stops everything in order. (Without ``--scenario``
the demo runs the closed loop instead: demo/loop.)
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from gpuscale.agent.app import Agent, AgentConfig
from gpuscale.attribution.sources import ScenarioSources
from gpuscale.common.freshness import staleness_bound
from gpuscale.common.shutdown import cancel_on_signals
from gpuscale.engines.simulated_engines import EngineSockets, engines_for, start_engines
from gpuscale.scaler.config import ScalerConfig, load_file
from gpuscale.scaler.root import Scaler
from gpuscale.scaler.sources.demand import DemandConfig
from gpuscale.scaler.state.history import STEP_S
from gpuscale.telemetry.model import Absent
from gpuscale.telemetry.scenario import load_scenario
from gpuscale.telemetry.simulated_gpus import SimulatedBackend

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ScenarioOptions:
    """What ``gpuscale demo --scenario`` serves, and where (the CLI checks the values)."""

    scenario: str  # the name of a shipped scenario, or a YAML file
    host: str  # the scaler's and the agents' listen address
    port: int  # the scaler's gRPC port (0: one free)
    speed: float = 1.0  # simulated time runs this many times faster
    interval: float = 1.0  # the agents' sample interval, seconds
    metrics_port: int = 0  # the first agent's /metrics port, node i's this + i (0: free)
    scaler_config: Path | None = None  # the scaler's YAML (demand sources, advisory)
    history_step: float | None = None  # seconds between history records (None: STEP_S)


async def serve_scenario(args: ScenarioOptions) -> None:
    """Serve ``args.scenario``'s nodes until cancelled."""
    scenario = load_scenario(args.scenario)
    agents = []
    engines: list[web.AppRunner] = []
    sockets = EngineSockets()  # each engine on a port chosen free: demos side by side
    for i, node in enumerate(scenario.nodes):
        backend = SimulatedBackend(node, speed=args.speed)
        sources = ScenarioSources(node, ip_base=f"127.{i + 1}.0", engine_port=sockets.claim)
        agent = Agent(backend, AgentConfig(args.host, args.metrics_port + i if
                                           args.metrics_port else 0, args.interval, node.name,
                                           stream_port=0), sources)
        agents.append(agent)
        loads = {(p.pod.namespace, p.pod.name): p.load for p in node.processes if p.pod}
        pods = sources.pod_infos()
        assert not isinstance(pods, Absent)
        engines.extend(await start_engines(engines_for(dict(pods), loads),
                                           backend.scenario_time, sockets))
    demand, advisory = (load_file(args.scaler_config) if args.scaler_config
                        else (DemandConfig(), ()))
    scaler = Scaler(ScalerConfig(
        host=args.host, port=args.port, metrics_port=None, in_process=True,
        demand=demand, advisory=advisory,
        history_step_s=args.history_step or STEP_S,
        stale_after_s=staleness_bound(args.interval)))
    for agent in agents:
        agent.add_sink(scaler.fleet)
    host = "localhost" if args.host in ("0.0.0.0", "::", "[::]") else args.host
    cancel_on_signals()

    def agent_up(agent: Agent) -> Callable[[int], None]:
        return lambda port: print(
            f"agent {agent.config.hostname}: metrics at http://{host}:{port}/metrics; what "
            f"it reads: gpuscale gpus --agent {host}:{agent.stream_port}", flush=True)

    def scaler_up(port: int) -> None:
        pod = next((p.pod for n in scenario.nodes for p in n.processes if p.pod), None)
        example = {"scaledObjectRef": {"name": "demo", "namespace": pod.namespace if pod
                                       else "default", "scalerMetadata": {
                       "podSelector": f"app={pod.name.rsplit('-', 1)[0]}" if pod else "app=x",
                       "profile": "gpu-utilization"}},
                   "metricName": "gpuscale-gpu-utilization"}
        print(f"KEDA external scaler on {host}:{port}; try:\n  gpuscale keda GetMetrics "
              f"'{json.dumps(example)}' --scaler {host}:{port}"
              f"\nWatch the fleet: gpuscale top "
              f"--scaler {host}:{port}; idle GPUs: gpuscale idle --scaler {host}:{port}",
              flush=True)

    try:
        async with asyncio.TaskGroup() as tg:
            for agent in agents:
                tg.create_task(agent.run(agent_up(agent)),
                               name=f"agent-{agent.config.hostname}")
            tg.create_task(scaler.run(scaler_up), name="scaler")
    except asyncio.CancelledError:
        log.info("stopping on signal")
    finally:
        await asyncio.gather(*(r.cleanup() for r in engines))
        sockets.close()
