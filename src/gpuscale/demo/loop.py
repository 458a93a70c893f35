"""The live closed loop behind ``gpuscale demo``: replicas that follow load through the real
agent and scaler, with KEDA and the HPA modelled on top, all in one process.

    requests (trace or pattern) -> serving model (models/serving.py), one replica per pod
      -> each pod holds one simulated H100 on a simulated node: its duty cycle is the GPU's
         utilization, and its vLLM engine serves /metrics at the pod's loopback IP
      -> one agent per node samples the GPUs, attributes them to the pods, scrapes the
         engines and streams the pods' signals over its telemetry gRPC stream
      -> the scaler (AgentSubscriber + ExternalScaler) on --port (6000)
      -> KEDA + HPA (models/keda.py, models/hpa.py) call GetMetricSpec, GetMetrics and
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
import contextlib
import logging
import shutil
import sys
import time
from collections.abc import Callable
from typing import Any

import grpc
from aiohttp import web

from gpuscale.agent.app import Agent, AgentConfig
from gpuscale.agent.sampler import MIN_INTERVAL_S
from gpuscale.common.freshness import staleness_bound
from gpuscale.common.shutdown import cancel_on_signals
from gpuscale.demo.defaults import GPUS_PER_NODE
from gpuscale.demo.hpa_path import control_hpa, hpa_metrics, local_api
from gpuscale.demo.view import (
    HIDE_CURSOR,
    SHOW_CURSOR,
    Decision,
    Status,
    Summary,
    View,
    ViewLog,
    explain_command,
    fmt_time,
    grpcurl_hint,
)
from gpuscale.demo.world import (
    GPU_MODEL,
    NAMESPACE,
    POLLING_S,
    WORKLOAD,
    Engines,
    LiveConfig,
    SimClock,
    World,
)
from gpuscale.models.hpa import Metric, MetricSource, TargetType
from gpuscale.models.keda import (
    HPA_SYNC_S,
    SCALER_ATTEMPTS,
    ScaledObjectLoop,
    ScaledObjectSpec,
)
from gpuscale.models.serving import needed_replicas, planner_metadata
from gpuscale.models.slo import SLO_TTFT_S, Slo
from gpuscale.proto import externalscaler_pb2 as pb
from gpuscale.proto import externalscaler_pb2_grpc as pb_grpc
from gpuscale.scaler.config import ScalerConfig
from gpuscale.scaler.root import Scaler
from gpuscale.scaler.sources.demand import DemandConfig
from gpuscale.scaler.sources.demand import parse_config as parse_demand
from gpuscale.scaler.state.history import STEP_S

log = logging.getLogger(__name__)


def trigger_metadata(cfg: LiveConfig) -> dict[str, str]:
    """The demo ScaledObject's trigger metadata. For the planner: the serving model's
    start-up, capacity and batch, in simulated seconds (its planner runs on simulated
    time)."""
    md = {"podSelector": f"app={WORKLOAD}", "profile": cfg.profile}
    if cfg.profile == "vllm-planner":
        md.update(planner_metadata(cfg.params, SLO_TTFT_S))
    if cfg.min_replicas == 0:  # at zero pods only the gateway's queue shows the load
        md["demandSource"] = GATEWAY
    return md


GATEWAY = "gateway"  # the demand source of a demo that scales to zero


async def serve_gateway(world: World) -> tuple[web.AppRunner, DemandConfig]:
    """The serving fleet's gateway as the scaler's demand source: its requests waiting
    for a replica as ``gateway_pending_requests`` on a /metrics of its own (a loopback
    port chosen free), polled as the scaler polls any ``kind: metrics`` source - what
    wakes a workload at zero replicas, where no pod shows the load."""
    sockets = world.sockets
    port = sockets.claim("127.0.0.1")
    runner = await sockets.serve("127.0.0.1", port, lambda: (
        "# TYPE gateway_pending_requests gauge\n"
        f"gateway_pending_requests {len(world.model.queue)}\n"))
    config = parse_demand({"demandSources": [{
        "name": GATEWAY, "kind": "metrics", "url": f"http://127.0.0.1:{port}/metrics",
        "metric": "gateway_pending_requests"}], "interval_s": 0.2, "timeout_s": 1.0})
    return runner, config


async def control(world: World, clock: SimClock, status: Status, address: str,
                  on_decision: Callable[[Decision], None]) -> None:
    """KEDA's operator and the HPA, as gRPC clients of the scaler."""
    cfg = world.cfg
    ref = pb.ScaledObjectRef(name=WORKLOAD, namespace=NAMESPACE,
                             scalerMetadata=trigger_metadata(cfg))
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
                        got = await _retried(stub.GetMetrics, pb.GetMetricsRequest(
                            scaledObjectRef=ref, metricName=name))
                        mv = got.metricValues[0]
                        value = mv.metricValueFloat or float(mv.metricValue)
                    except grpc.aio.AioRpcError as exc:
                        status.error = f"GetMetrics {name}: {exc.code().name}: {exc.details()}"
                    metrics.append(Metric(MetricSource.EXTERNAL, TargetType.AVERAGE_VALUE,
                                          target, value))
                    status.metrics.append((name, target, value))
                try:
                    status.active = (await _retried(stub.IsActive, ref)).result
                except grpc.aio.AioRpcError as exc:
                    status.active = None
                    status.error = f"IsActive: {exc.code().name}: {exc.details()}"
                status.rpc_ms = (time.monotonic() - began) * 1000.0
                desired = loop.decide(now, replicas, world.ready_count(), metrics,
                                      status.active)
                if desired != replicas:
                    world.scale(desired)
                    decision = Decision(now, replicas, desired, loop.reason, time.time())
                    status.decisions.append(decision)
                    on_decision(decision)
            await asyncio.sleep(0.02)


async def _retried(call: Callable[..., Any], request: Any) -> Any:
    """One of KEDA's calls, tried once more after an error, as KEDA's scaler cache does
    (``SCALER_ATTEMPTS``); the last error is raised."""
    for _ in range(SCALER_ATTEMPTS - 1):
        with contextlib.suppress(grpc.aio.AioRpcError):  # KEDA rebuilds its scaler
            return await call(request, timeout=2.0)
    return await call(request, timeout=2.0)


async def drive(world: World, clock: SimClock, engines: Engines) -> None:
    """Advance the serving model with the clock; start and stop engines as pods change."""
    while not world.done:
        world.advance(min(clock.now(), world.cfg.duration))
        await engines.reconcile()
        await asyncio.sleep(0.02)


def summarize(world: World, max_seen: int) -> Summary:
    """Up to where the run got (all of it, unless it was stopped early). What the same
    requests would have cost otherwise is the command's to add (the simulator)."""
    ran = max(world.now, 1.0)
    slo = Slo.of(world.model, ran)
    return Summary(ran, world.model.gpu_seconds / 3600.0, len(slo.bad_minutes), slo.minutes,
                   slo.p95_ttft_s, world.changes, max_seen, world.cfg.profile)


async def run_live(cfg: LiveConfig, tty: bool | None = None,
                   out: Callable[[str], None] | None = None) -> Summary:
    """Run the loop for ``cfg.duration`` simulated seconds; returns the summary."""
    tty = sys.stdout.isatty() if tty is None else tty
    write = out or (lambda text: print(text, flush=True))
    clock = SimClock(cfg.speed)
    world = _warm_world(cfg)
    interval = min(1.0, max(MIN_INTERVAL_S, 1.0 / cfg.speed))  # ~1 simulated s, <= 5 Hz
    agents = [Agent(b, AgentConfig("127.0.0.1", 0, interval, b.node.name, stream_port=0), s)
              for b, s in zip(world.backends, world.sources, strict=True)]
    # The planner runs on simulated time (the engines' counters are served at the rate
    # of the scaler's clock, see World.engine_text), so its windows are simulated seconds.
    # The agents' stream addresses are known once they listen (set below).
    waiting = [len(agents) + 1 + cfg.hpa]  # listeners not up yet: the agents' streams,
    up = asyncio.Event()  # the scaler, and with the HPA path the metrics API

    def listening(_port: int) -> None:
        waiting[0] -= 1
        if waiting[0] == 0:
            up.set()

    local = local_api() if cfg.hpa else None
    gateway, demand = await serve_gateway(world) if cfg.min_replicas == 0 else \
        (None, DemandConfig())
    try:
        scaler = Scaler(ScalerConfig(host=cfg.host, port=cfg.port, metrics_port=None,
                                     name="demo", stale_after_s=staleness_bound(interval),
                                     time_scale=cfg.speed, demand=demand,
                                     history_step_s=history_step(cfg.speed)),
                        components=[local.component(cfg, listening)] if local else ())
    except BaseException:  # (a taken port): what was claimed goes with it
        if gateway is not None:
            await gateway.cleanup()
        world.sockets.close()
        if local is not None:
            local.remove()
        raise
    subscriber = scaler.subscriber
    assert subscriber is not None
    address = f"{'localhost' if cfg.host in ('0.0.0.0', '::', '[::]') else cfg.host}:" \
              f"{scaler.port}"
    status = Status()
    view = View(world, clock, status, scaler.fleet, address, tty, write, plans=scaler.plans,
                hint=grpcurl_hint(address, trigger_metadata(cfg)))
    engines = Engines(world)
    handler = ViewLog(view) if tty else None
    if handler is not None:
        logging.getLogger().addHandler(handler)

    if tty:
        write(HIDE_CURSOR)
    cancel_on_signals()  # Ctrl-C or SIGTERM: stop, and still print the summary
    try:
        await engines.reconcile()  # the warm replicas' engines answer from the first scrape
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(a.run(listening), name=f"agent-{a.config.hostname}")
                     for a in agents]
            tasks.append(tg.create_task(scaler.run(listening), name="scaler"))
            await up.wait()
            subscriber.set_addresses(f"127.0.0.1:{a.stream_port}" for a in agents)
            if local is not None:  # the plain-HPA path: kubectl reads what the HPA reads
                kubectl = local.kubectl_hint(hpa_metrics(trigger_metadata(cfg))[0])
                view.hint, view.hint_title = kubectl, "what the HPA gets (kubectl):"
                if not tty:
                    write(f"custom metrics API (local mode, loopback only) on "
                          f"https://127.0.0.1:{local.port}; the HPA reads it every "
                          f"{HPA_SYNC_S:g} s. What it gets:\n  {kubectl}")
            if not tty:
                write(_serving(cfg, address))
            tasks.append(tg.create_task(view.run(), name="view"))
            tasks.append(tg.create_task(
                control(world, clock, status, address, view.decision) if local is None else
                control_hpa(world, clock, status, local, trigger_metadata(cfg),
                            view.decision), name="keda-hpa"))
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
        if gateway is not None:
            await gateway.cleanup()
        await engines.close()
        if local is not None:
            local.remove()  # the run's certificate, key and token
        if tty:
            write(SHOW_CURSOR)
    summary = summarize(world, view.max_seen)
    if tty:
        write("\x1b[H\x1b[2J" + "\n".join(view.screen(terminal_width())))
    write("\n".join(["", *summary.lines()]))
    return summary


def history_step(speed: float) -> float:
    """Wall seconds between the scaler's recorded moments: its default step (KEDA's
    polling interval) in simulated time, so a decision the demo prints (to the wall
    second) can be looked up with ``explain --at`` - at x40 the default 30 wall seconds
    would be 20 simulated minutes - but no shorter than HISTORY_MIN_STEP_S. Memory stays
    bounded: the history keeps KEEP_S / step moments per workload, ~2 KB each with the
    planner's terms: 4,800 (~10 MB) at x40, at most 7,200 (~15 MB) for the demo's one."""
    return max(HISTORY_MIN_STEP_S, min(STEP_S, STEP_S / speed))


# Half the printed decision times' resolution (a wall second), so one is always within
# reach of explain --at's nearest moment.
HISTORY_MIN_STEP_S = 0.5


def _warm_world(cfg: LiveConfig) -> World:
    """The simulated cluster, running what the first minute's load needs (within the
    replica bounds) warm when the demo starts."""
    if cfg.max_replicas > cfg.nodes * GPUS_PER_NODE:
        raise ValueError(f"max replicas {cfg.max_replicas} do not fit on {cfg.nodes} nodes "
                         f"of {GPUS_PER_NODE} GPUs")
    world = World(cfg)
    first = needed_replicas([r for r in cfg.requests if r.arrival_s < 60.0], 60.0, cfg.params)
    world.scale(min(cfg.max_replicas, max(cfg.min_replicas, first[0])), warm=True)
    return world


def _serving(cfg: LiveConfig, address: str) -> str:
    """What a run without a terminal says once the scaler serves: where, what runs, and
    the commands that ask it what KEDA gets and why (with the plain HPA, what the HPA
    reads: explain and top show the Deployment it reads through the metrics API)."""
    if cfg.hpa:
        return (f"scaler on {address}; {cfg.nodes} simulated nodes of {GPUS_PER_NODE}x "
                f"{GPU_MODEL}; profile {cfg.profile}; simulated {fmt_time(cfg.duration)} "
                f"at x{cfg.speed:g}; the HPA's reasons are on each decision line. Watch "
                f"it: gpuscale top --scaler {address}; why this count: "
                f"{explain_command(cfg.min_replicas, cfg.max_replicas)} --scaler {address} "
                f"{HPA_TRY}; idle GPUs and their cost: gpuscale idle --scaler {address} "
                f"{_wall(cfg)}")
    return (f"KEDA external scaler on {address}; {cfg.nodes} simulated nodes of "
            f"{GPUS_PER_NODE}x {GPU_MODEL}; profile {cfg.profile}; simulated "
            f"{fmt_time(cfg.duration)} at x{cfg.speed:g}. Ask it what KEDA "
            f"gets:\n  {grpcurl_hint(address, trigger_metadata(cfg))}\n"
            f"Watch it: gpuscale top --scaler {address}; why this count: "
            f"{explain_command(cfg.min_replicas, cfg.max_replicas)} --scaler {address}; "
            f"idle GPUs and their cost: gpuscale idle --scaler {address} {_wall(cfg)}")


def _wall(cfg: LiveConfig) -> str:
    """Why idle's minutes are not the demo's: it counts the scaler's history on the wall
    clock, the demo's times are simulated."""
    return (f"(wall-clock minutes: the times here are simulated, x{cfg.speed:g}, so a "
            f"simulated hour is {3600 / cfg.speed:g} s of idle's window)")


# With the plain HPA there is no ScaledObject: explain and top show the Deployment the HPA
# reads, and explain models the HPA alone (tools.explain_hpa).
HPA_TRY = "(the Deployment the HPA reads through custom.metrics.k8s.io; no ScaledObject)"


def terminal_width() -> int:
    return shutil.get_terminal_size((80, 24)).columns
