"""``gpuscale demo``: a simulated fleet end to end in one process.

One agent per scenario node (simulated GPUs, attribution from the scenario, /metrics on
its own port), simulated inference engines at the pods' loopback IPs (scraped by the
agents like real pods), all feeding one fleet view, and the KEDA external scaler on :6000
answering from it. SIGTERM or Ctrl-C stops everything in order.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from aiohttp import web

from gpuscale.agent.app import Agent, AgentConfig
from gpuscale.attribution.sources import ScenarioSources
from gpuscale.common.errors import ConfigError
from gpuscale.common.shutdown import cancel_on_signals
from gpuscale.engines.simulated import engines_for, start_engines
from gpuscale.scaler.demand import DemandSources, ScalerConfig, load_config
from gpuscale.scaler.fleet import FleetView
from gpuscale.scaler.service import ScalerServer, ScalerService
from gpuscale.telemetry.model import Absent
from gpuscale.telemetry.scenario import ScenarioError, load_scenario
from gpuscale.telemetry.simulated import SimulatedBackend

log = logging.getLogger(__name__)


async def demo(args: argparse.Namespace) -> None:
    scenario = load_scenario(args.scenario)
    fleet = FleetView(stale_after=max(3.0 * args.interval, 2.0))
    agents = []
    engines: list[web.AppRunner] = []
    for i, node in enumerate(scenario.nodes):
        backend = SimulatedBackend(node, speed=args.speed)
        sources = ScenarioSources(node, ip_base=f"127.{i + 1}.0")
        agent = Agent(backend, AgentConfig(args.host, args.metrics_port + i if
                                           args.metrics_port else 0, args.interval, node.name),
                      sources)
        agent.add_sink(fleet)
        agents.append(agent)
        loads = {(p.pod.namespace, p.pod.name): p.load for p in node.processes if p.pod}
        pods = sources.pod_infos()
        assert not isinstance(pods, Absent)
        engines.extend(await start_engines(engines_for(dict(pods), loads),
                                           backend.scenario_time))
    demand = DemandSources(load_config(args.scaler_config) if args.scaler_config
                           else ScalerConfig())
    server = ScalerServer(ScalerService(fleet, demand=demand.pending), host=args.host,
                          port=args.port)
    host = "localhost" if args.host in ("0.0.0.0", "::", "[::]") else args.host
    cancel_on_signals()

    def agent_up(node: str) -> Callable[[int], None]:
        return lambda port: print(f"agent {node}: metrics at http://{host}:{port}/metrics",
                                  flush=True)

    def scaler_up(port: int) -> None:
        pod = next((p.pod for n in scenario.nodes for p in n.processes if p.pod), None)
        example = {"scaledObjectRef": {"name": "demo", "namespace": pod.namespace if pod
                                       else "default", "scalerMetadata": {
                       "podSelector": f"app={pod.name.rsplit('-', 1)[0]}" if pod else "app=x",
                       "profile": "gpu-utilization"}},
                   "metricName": "gpuscale-gpu-utilization"}
        print(f"KEDA external scaler on {host}:{port}; try:\n  grpcurl -plaintext -d "
              f"'{json.dumps(example)}' {host}:{port} "
              f"externalscaler.ExternalScaler/GetMetrics", flush=True)

    try:
        async with asyncio.TaskGroup() as tg:
            for agent, node in zip(agents, scenario.nodes, strict=True):
                tg.create_task(agent.run(agent_up(node.name)), name=f"agent-{node.name}")
            tg.create_task(server.serve(scaler_up), name="scaler")
            tg.create_task(demand.run(), name="demand-sources")
    except asyncio.CancelledError:
        log.info("stopping on signal")
    finally:
        await asyncio.gather(*(r.cleanup() for r in engines))


def run_demo(args: argparse.Namespace) -> int:
    if args.scenario is None:
        return run_loop(args)
    loop_only = [f"--{k}" for k in ("pattern", "trace", "rate", "duration")
                 if getattr(args, k) is not None]
    if loop_only:
        print(f"gpuscale: {', '.join(loop_only)} drive the closed loop; a --scenario runs "
              "its own load", file=sys.stderr)
        return 2
    args.speed = args.speed or 1.0
    args.host = args.host or "0.0.0.0"
    try:
        return _serve(demo(args))
    except (ScenarioError, ConfigError) as exc:
        print(f"gpuscale: {exc}", file=sys.stderr)
        return 2


def _serve(main: Coroutine[Any, Any, object]) -> int:
    """Run a demo until it ends; a port that cannot be bound (alone or inside a task
    group) is exit 1 with the reason, not a traceback."""
    try:
        asyncio.run(main)
    except OSError as exc:
        print(f"gpuscale: cannot listen: {exc}", file=sys.stderr)
        return 1
    except ExceptionGroup as group:
        bind = group.subgroup(OSError)
        if bind is None:
            raise
        print(f"gpuscale: cannot listen: {bind.exceptions[0]}", file=sys.stderr)
        return 1
    return 0


def run_loop(args: argparse.Namespace) -> int:
    """The closed loop (control/live.py) from the demo's command line."""
    from gpuscale.cli import LIVE_DURATION, LIVE_RATE, LIVE_SPEED, load_requests
    from gpuscale.control.live import GPUS_PER_NODE, LiveConfig, run_live
    from gpuscale.scaler.profiles import PROFILES

    def refuse(why: str) -> int:
        print(f"gpuscale: {why}", file=sys.stderr)
        return 2

    speed = LIVE_SPEED if args.speed is None else args.speed
    if not 0 < speed <= 1000:
        return refuse("--speed must be above 0 and at most 1000")
    if not 1 <= args.nodes <= 16:
        return refuse("--nodes must be 1 to 16")
    if not 0 <= args.min_replicas <= args.max_replicas <= args.nodes * GPUS_PER_NODE \
            or args.max_replicas < 1:
        return refuse(f"need 0 <= --min-replicas <= --max-replicas <= "
                      f"{args.nodes * GPUS_PER_NODE} (8 GPUs per node) and --max-replicas "
                      ">= 1")
    if args.profile not in PROFILES:
        return refuse(f"--profile {args.profile!r} is not one of {', '.join(PROFILES)}")
    try:
        requests, duration = load_requests(
            args.pattern, args.trace,
            args.rate if args.rate is not None else 1.0 if args.trace else LIVE_RATE,
            args.duration, pattern_duration=LIVE_DURATION)
    except ValueError as exc:
        return refuse(str(exc))
    # The agents' stream connecting is routine here; the view carries what matters.
    logging.getLogger("gpuscale.stream").setLevel(logging.WARNING)
    cfg = LiveConfig(requests, duration, speed=speed, nodes=args.nodes,
                     profile=args.profile, min_replicas=args.min_replicas,
                     max_replicas=args.max_replicas, host=args.host or "127.0.0.1",
                     port=args.port)
    return _serve(run_live(cfg))
