"""Command line: ``gpuscale agent | gpus | scaler | demo | profiles``."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from enum import Enum
from pathlib import Path
from typing import Any

from gpuscale import __version__
from gpuscale.attribution.cgroup import PidResolver
from gpuscale.attribution.kubelet import DEFAULT_SOCKET, PodResourcesClient
from gpuscale.attribution.model import NodeAttribution
from gpuscale.attribution.sources import (
    AttributionSources,
    ClusterSources,
    ScenarioSources,
    attribute_tick,
    cluster_sources,
)
from gpuscale.stream.tls import TlsFiles
from gpuscale.telemetry.backend import GpuBackend
from gpuscale.telemetry.load import Request
from gpuscale.telemetry.model import Absent, BackendState, NodeSnapshot
from gpuscale.telemetry.scenario import ScenarioError, builtin_scenarios, load_scenario
from gpuscale.telemetry.simulated import SimulatedBackend

log = logging.getLogger("gpuscale")

DEFAULT_SCENARIO = "h100-vllm"
LIVE_SPEED = 40.0  # the demo loop's fast-forward: a simulated hour in 90 s
LIVE_RATE = 30.0  # requests/s at the pattern's busiest (about 6 replicas)
LIVE_DURATION = 3600.0  # simulated seconds: one compressed day-night cycle


async def make_sources(args: argparse.Namespace, backend: GpuBackend,
                       watch_pods: bool = True) -> AttributionSources | None:
    """Attribution inputs matching the backend (see --attribution)."""
    mode = args.attribution
    if mode == "auto":
        mode = "scenario" if isinstance(backend, SimulatedBackend) else "cluster"
    if mode == "off":
        return None
    if mode == "scenario":
        if not isinstance(backend, SimulatedBackend):
            raise ScenarioError("--attribution scenario needs the simulated backend")
        return ScenarioSources(backend.node)
    if not watch_pods:
        return ClusterSources(PodResourcesClient(args.kubelet_socket,
                                                 tuple(args.extra_resource)), None,
                              PidResolver(args.proc_root), pods_missing_reason="not watched")
    return await cluster_sources(args.kubelet_socket, args.node_name, args.proc_root,
                                 args.kubeconfig, tuple(args.extra_resource))


def make_backend(kind: str, scenario: str, node: str | None, pcie: bool,
                 speed: float = 1.0, interval: float = 1.0,
                 node_name: str = "") -> GpuBackend:
    """Build the backend. ``auto`` takes NVML when it sees at least one GPU, else the sim."""
    if kind in ("nvml", "auto"):
        from gpuscale.telemetry.nvml import NvmlBackend

        nvml = NvmlBackend(pcie=pcie, interval=interval, node=node_name)
        if kind == "nvml":
            return nvml
        probe = nvml.sample()
        if probe.state is BackendState.OK and probe.gpus:
            return nvml
        nvml.close()
        why = probe.reason if probe.state is not BackendState.OK else "no GPUs"
        log.warning("NVML not usable here (%s): using simulated GPUs from scenario %r",
                    why, scenario)
    return SimulatedBackend(load_scenario(scenario).node(node), speed=speed, pcie=pcie)


def _add_backend_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpu-backend", choices=["auto", "nvml", "sim"], default="auto",
                   help="where readings come from; auto = NVML when a GPU is present, else "
                        "the simulated scenario (default: auto)")
    p.add_argument("--scenario", default=DEFAULT_SCENARIO,
                   help="simulated fleet: a YAML file or a shipped scenario "
                        f"({', '.join(builtin_scenarios())}); default {DEFAULT_SCENARIO}")
    p.add_argument("--node", default=None,
                   help="which node of the scenario to simulate (default: the first)")
    p.add_argument("--speed", type=float, default=1.0,
                   help="simulated time runs this many times faster than real time")
    p.add_argument("--pcie", action="store_true",
                   help="read PCIe throughput (NVML blocks ~20 ms per GPU per reading)")
    a = p.add_argument_group("attribution (which pod uses which GPU)")
    a.add_argument("--attribution", choices=["auto", "cluster", "scenario", "off"],
                   default="auto", help="auto: from the scenario with simulated GPUs, from "
                                        "the kubelet, API and /proc with NVML")
    a.add_argument("--kubelet-socket", type=Path, default=DEFAULT_SOCKET,
                   help=f"kubelet PodResources socket (default {DEFAULT_SOCKET})")
    a.add_argument("--kubeconfig", type=Path, default=None,
                   help="kubeconfig for the pod watch (default: in-cluster credentials, "
                        "else $KUBECONFIG or ~/.kube/config)")
    a.add_argument("--node-name", default=os.environ.get("NODE_NAME", ""),
                   help="this node's Kubernetes name (default $NODE_NAME)")
    a.add_argument("--proc-root", type=Path, default=Path("/proc"),
                   help="host /proc for PID -> pod (needs hostPID; default /proc)")
    a.add_argument("--extra-resource", action="append", default=[],
                   help="another extended resource name whose devices are GPUs (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuscale", description=__doc__)
    parser.add_argument("--version", action="version", version=f"gpuscale {__version__}")
    parser.add_argument("--log-level", default="INFO",
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = parser.add_subparsers(dest="command", required=True)

    agent = sub.add_parser("agent", help="run the node agent (sampler + /metrics)")
    _add_backend_args(agent)
    agent.add_argument("--interval", type=float, default=1.0,
                       help="sample interval in seconds (0.2 or more; default 1)")
    agent.add_argument("--host", default="0.0.0.0", help="listen address (default 0.0.0.0)")
    agent.add_argument("--port", type=int, default=9400, help="metrics port (default 9400)")
    agent.add_argument("--stream-port", type=int, default=9401,
                       help="telemetry stream for scalers (default 9401; -1: off)")
    agent.add_argument("--stream-tls-cert", type=Path, help="stream server certificate (PEM)")
    agent.add_argument("--stream-tls-key", type=Path, help="its private key (PEM)")
    agent.add_argument("--stream-tls-ca", type=Path,
                       help="CA that signs the scalers' client certificates (PEM)")
    agent.add_argument("--stream-insecure", action="store_true",
                       help="serve the stream in plaintext (only on trusted networks)")
    agent.add_argument("--hostname", default="",
                       help="Hostname label on dcgm series (default: $NODE_NAME, else this "
                            "host's name)")

    demo = sub.add_parser(
        "demo", help="the closed loop on simulated GPUs: load -> replicas -> agents -> "
                     "scaler on :6000 -> KEDA/HPA model over gRPC -> replicas follow load "
                     "(or, with --scenario, a static simulated fleet served until stopped)")
    demo.add_argument("--scenario", default=None,
                      help="serve a static scenario instead of the closed loop "
                           f"({', '.join(builtin_scenarios())} or a YAML file) until stopped")
    demo.add_argument("--speed", type=float, default=None,
                      help="fast-forward: simulated time runs this many times faster "
                           f"(default {LIVE_SPEED:g} for the loop, 1 for a scenario)")
    live = demo.add_mutually_exclusive_group()
    live.add_argument("--trace", type=Path,
                      help="loop: replay this request trace (CSV as for simulate)")
    live.add_argument("--pattern", choices=["diurnal", "bursts", "idle-night"],
                      help="loop: a synthetic load shape (default diurnal)")
    demo.add_argument("--rate", type=float, default=None,
                      help=f"loop: busiest requests/s of a pattern (default {LIVE_RATE:g}), "
                           "or a multiplier of a trace's arrivals (default 1)")
    demo.add_argument("--duration", type=float, default=None,
                      help=f"loop: simulated seconds (default {LIVE_DURATION:g} for a "
                           "pattern, the whole trace otherwise)")
    demo.add_argument("--profile", default="vllm-inference",
                      help="loop: the gpuscale profile KEDA asks for (default vllm-inference)")
    demo.add_argument("--min-replicas", type=int, default=1,
                      help="loop: minReplicaCount (0: scale to zero when idle)")
    demo.add_argument("--max-replicas", type=int, default=16,
                      help="loop: maxReplicaCount (at most 8 per --nodes)")
    demo.add_argument("--nodes", type=int, default=2, help="loop: simulated 8xH100 nodes")
    demo.add_argument("--interval", type=float, default=1.0,
                      help="scenario: sample interval, s")
    demo.add_argument("--host", default=None,
                      help="scaler listen address (default 0.0.0.0 for a scenario, "
                           "127.0.0.1 for the loop)")
    demo.add_argument("--port", type=int, default=6000, help="scaler gRPC port (6000)")
    demo.add_argument("--metrics-port", type=int, default=9400,
                      help="first agent's metrics port; node i uses this + i (9400)")
    demo.add_argument("--scaler-config", type=Path, default=None,
                      help="scaler configuration YAML (demand sources)")

    sc = sub.add_parser("scaler", help="the KEDA external scaler, fed by every agent's "
                                       "telemetry stream")
    sc.add_argument("--host", default="0.0.0.0", help="listen address")
    sc.add_argument("--port", type=int, default=6000, help="gRPC port (6000)")
    sc.add_argument("--metrics-port", type=int, default=9402, help="metrics port (9402)")
    sc.add_argument("--agents", type=lambda v: [a for a in v.split(",") if a], default=[],
                    help="agent stream addresses host:port,... (static)")
    sc.add_argument("--agent-service", default="",
                    help="NAMESPACE/NAME of the agents' headless Service (EndpointSlices)")
    sc.add_argument("--agent-port", type=int, default=9401,
                    help="agent stream port when the EndpointSlice names none")
    sc.add_argument("--resolve-targets", action="store_true",
                    help="resolve ScaledObjects' scaleTargetRef through the API")
    sc.add_argument("--kubeconfig", type=Path, default=None,
                    help="kubeconfig (default: in-cluster credentials)")
    sc.add_argument("--config", type=Path, default=None,
                    help="scaler configuration YAML (demand sources)")
    sc.add_argument("--agent-tls-cert", type=Path, help="client certificate for agents (PEM)")
    sc.add_argument("--agent-tls-key", type=Path, help="its private key (PEM)")
    sc.add_argument("--agent-tls-ca", type=Path, help="CA that signs the agents' certificates")
    sc.add_argument("--agent-tls-server-name", default="gpuscale-agent",
                    help="name the agents' certificates carry (default gpuscale-agent)")
    sc.add_argument("--agents-insecure", action="store_true",
                    help="subscribe in plaintext (only on trusted networks)")
    sc.add_argument("--tls-cert", type=Path, help="KEDA-facing server certificate (PEM)")
    sc.add_argument("--tls-key", type=Path, help="its private key (PEM)")
    sc.add_argument("--tls-ca", type=Path,
                    help="CA of KEDA's client certificate (TriggerAuthentication caCert's "
                         "counterpart); with these three KEDA must connect with mTLS")

    sim = sub.add_parser("simulate", help="replay a request trace through KEDA + HPA and "
                                          "compare scaling policies")
    src = sim.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", type=Path,
                     help="CSV: TIMESTAMP, ContextTokens, GeneratedTokens (Azure LLM format)")
    src.add_argument("--pattern", choices=["diurnal", "bursts", "idle-night"],
                     help="a synthetic load shape instead of a trace (with --duration; "
                          "--rate is then requests/s)")
    sim.add_argument("--min-replicas", type=int, default=1,
                     help="minReplicaCount for the autoscaled policies (0: scale to zero)")
    sim.add_argument("--rate", type=float, default=1.0,
                     help="multiply the arrivals (e.g. 8: eight times the traffic)")
    sim.add_argument("--speedup", type=float, default=1.0,
                     help="compress time (2: the trace plays in half the time)")
    sim.add_argument("--duration", type=float, default=None,
                     help="simulated seconds (default: the whole trace)")
    sim.add_argument("--loop", type=int, default=1,
                     help="play the trace this many times back to back (default 1)")
    sim.add_argument("--plot", type=Path, default=None,
                     help="also write a PNG: load, replicas and latency over time per "
                          "policy (needs matplotlib: pip install 'gpuscale[plot]')")
    sim.add_argument("--json", action="store_true", help="results as JSON")

    sub.add_parser("profiles", help="list the scaling profiles and signals")

    gpus = sub.add_parser("gpus", help="show this node's GPUs, MIG instances and processes")
    _add_backend_args(gpus)
    gpus.add_argument("--json", action="store_true", help="print the snapshot as JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "profiles":
        return _profiles()
    if args.command == "simulate":
        return _simulate(args)
    if args.command == "demo":
        from gpuscale.demo import run_demo

        return run_demo(args)
    if args.command == "scaler":
        from gpuscale.scaler.main import run_scaler

        try:
            args.agent_tls = tls_files(args.agent_tls_cert, args.agent_tls_key,
                                       args.agent_tls_ca)
            args.tls = tls_files(args.tls_cert, args.tls_key, args.tls_ca)
        except ValueError as exc:
            print(f"gpuscale: {exc}", file=sys.stderr)
            return 2
        return run_scaler(args)
    try:
        backend = make_backend(args.gpu_backend, args.scenario, args.node, args.pcie,
                               args.speed, getattr(args, "interval", 1.0),
                               getattr(args, "hostname", "") or args.node_name)
    except ScenarioError as exc:
        print(f"gpuscale: {exc}", file=sys.stderr)
        return 2
    if args.command == "agent":
        return _agent(args, backend)
    return _gpus(args, backend)


def _agent(args: argparse.Namespace, backend: GpuBackend) -> int:
    from gpuscale.agent.app import Agent, AgentConfig, run_until_signalled

    agent: Agent | None = None

    def listening(port: int) -> None:
        host = "localhost" if args.host in ("0.0.0.0", "::") else args.host
        stream = f"; telemetry stream on :{agent.stream_port}" if agent and \
            agent.stream_port else ""
        print(f"gpuscale agent ({backend.name} backend) serving metrics at "
              f"http://{host}:{port}/metrics (health: /healthz, /readyz){stream}", flush=True)

    try:
        tls = tls_files(args.stream_tls_cert, args.stream_tls_key, args.stream_tls_ca)
    except ValueError as exc:
        print(f"gpuscale: {exc}", file=sys.stderr)
        return 2
    if args.stream_port >= 0 and tls is None and not args.stream_insecure:
        print("gpuscale: the telemetry stream needs --stream-tls-cert, --stream-tls-key and "
              "--stream-tls-ca (mutual TLS), or --stream-insecure, or --stream-port -1",
              file=sys.stderr)
        return 2

    async def serve() -> None:
        nonlocal agent
        sources = await make_sources(args, backend)
        agent = Agent(backend, AgentConfig(args.host, args.port, args.interval, args.hostname,
                                           None if args.stream_port < 0 else args.stream_port,
                                           tls), sources)
        await run_until_signalled(agent, listening)

    try:
        asyncio.run(serve())
    except (ValueError, ScenarioError) as exc:
        print(f"gpuscale: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"gpuscale: cannot serve on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    return 0


def _gpus(args: argparse.Namespace, backend: GpuBackend) -> int:
    async def one_tick() -> tuple[NodeSnapshot, NodeAttribution | None]:
        sources = await make_sources(args, backend, watch_pods=False)
        try:
            snap = backend.sample()
            return snap, (await attribute_tick(sources, snap) if sources else None)
        finally:
            backend.close()
            if sources is not None:
                await sources.close()

    try:
        snap, att = asyncio.run(one_tick())
    except ScenarioError as exc:
        print(f"gpuscale: {exc}", file=sys.stderr)
        return 2
    if args.json:
        out = snapshot_to_json(snap)
        out["attribution"] = snapshot_to_json(att) if att is not None else None
        print(json.dumps(out, indent=2))
    else:
        print(format_table(snap, att))
    return 0 if snap.state is BackendState.OK else 1


def tls_files(cert: Path | None, key: Path | None, ca: Path | None) -> TlsFiles | None:
    """All three TLS files, or none (ValueError for a partial set)."""
    given = [p for p in (cert, key, ca) if p is not None]
    if not given:
        return None
    if cert is None or key is None or ca is None:
        raise ValueError("TLS needs a certificate, its key and a CA: all three files")
    return TlsFiles(cert, key, ca)


def load_requests(pattern: str | None, trace: Path | None, rate: float,
                  duration: float | None, speedup: float = 1.0, loops: int = 1,
                  pattern_duration: float = 3600.0) -> tuple[list[Request], float]:
    """The requests of a synthetic pattern or a trace, and the simulated seconds to run
    (a trace's last arrival + 5 minutes unless ``duration``). ValueError: a clear reason."""
    from gpuscale.control.simulate import scale_trace, synthetic
    from gpuscale.telemetry.load import read_trace

    if not rate > 0 or not speedup > 0:  # also refuses NaN
        raise ValueError("--rate and --speedup must be positive")
    if duration is not None and not duration > 0:
        raise ValueError("--duration must be positive")
    if loops < 1:
        raise ValueError("--loop must be at least 1")
    if trace is None:
        seconds = duration or pattern_duration
        return synthetic(pattern or "diurnal", seconds, rate), seconds
    requests = scale_trace(read_trace(trace), rate, speedup, duration, loops)  # TraceError
    if not requests:
        raise ValueError("no request in the chosen slice of the trace")
    return requests, duration or requests[-1].arrival_s + 300.0


def _simulate(args: argparse.Namespace) -> int:
    from gpuscale.control.simulate import compare, format_table

    try:
        requests, duration = load_requests(args.pattern, args.trace, args.rate,
                                           args.duration, args.speedup, args.loop)
    except ValueError as exc:  # TraceError is one
        print(f"gpuscale: {exc}", file=sys.stderr)
        return 2
    if not requests:
        print("gpuscale: the pattern has no request in that duration", file=sys.stderr)
        return 2
    results = compare(requests, duration, min_replicas=args.min_replicas,
                      progress=_progress_bar() if sys.stderr.isatty() else None)
    if args.plot is not None:
        from gpuscale.control.plot import PlotUnavailable, plot_results

        try:
            plot_results(results, requests, duration, args.plot)
        except (PlotUnavailable, OSError) as exc:
            print(f"gpuscale: {exc}", file=sys.stderr)
            return 2
        print(f"plot written to {args.plot}", file=sys.stderr)
    if args.json:
        print(json.dumps([{k: v for k, v in asdict(r).items() if k != "timeline"}
                          for r in results], indent=2))
    else:
        print(f"{len(requests)} requests over {duration / 60:.0f} simulated minutes; SLO: "
              f"time to first token <= 2 s")
        print(format_table(results))
    return 0


def _progress_bar(width: int = 30) -> Callable[[str, float], None]:
    """A one-line bar on stderr, redrawn in place; a newline when it reaches 100 %."""
    def show(policy: str, fraction: float) -> None:
        filled = int(width * fraction)
        end = "\n" if fraction >= 1.0 else ""
        sys.stderr.write(f"\r[{'#' * filled}{' ' * (width - filled)}] {fraction:4.0%} "
                         f"{policy[:40]:<40}{end}")
        sys.stderr.flush()
    return show


def _profiles() -> int:
    from gpuscale.scaler.profiles import PROFILES, SIGNALS

    for p in PROFILES.values():
        targets = ", ".join(f"{t.signal} target {t.target:g}{SIGNALS[t.signal].unit} per pod"
                            f" (active above {t.activation:g})" for t in p.targets)
        print(f"{p.name}: {targets}\n    {p.why}\n")
    print("signals:")
    for sig in SIGNALS.values():
        print(f"  {sig.name} [{sig.unit}]: {sig.help}")
    return 0


def snapshot_to_json(snap: NodeSnapshot | NodeAttribution) -> dict[str, Any]:
    def clean(v: Any) -> Any:
        if isinstance(v, Enum):
            return v.value
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [clean(x) for x in v]
        return v

    result: dict[str, Any] = clean(asdict(snap))
    return result


def _fmt(v: float | Absent, unit: str = "", scale: float = 1.0, digits: int = 0) -> str:
    if isinstance(v, Absent):
        return v.value
    return f"{v * scale:.{digits}f}{unit}"


def _holders(att: NodeAttribution | None) -> dict[str, str]:
    """Device UUID -> "ns/pod/container, ..." for the table."""
    out: dict[str, list[str]] = {}
    for p in att.pods if att is not None else ():
        for d in p.devices:
            who = f"{p.namespace}/{p.pod}/{p.container}"
            out.setdefault(d.mig_uuid or d.gpu_uuid, []).append(who)
    return {k: ", ".join(v) for k, v in out.items()}


def format_table(snap: NodeSnapshot, att: NodeAttribution | None = None) -> str:
    if snap.state is not BackendState.OK:
        return f"{snap.node}: GPU backend {snap.backend} unavailable: {snap.reason}"
    owners = _holders(att)
    gib = 1 / 1024**3
    lines = [f"node {snap.node}  backend {snap.backend}  driver {snap.driver_version}  "
             f"{len(snap.gpus)} GPUs",
             f"{'GPU':<4}{'MIG':<5}{'NAME / PROFILE':<24}{'UTIL':>12}{'MEMORY':>20}"
             f"{'POWER':>8}  UUID"]
    for g in snap.gpus:
        mem = f"{_fmt(g.memory_used_bytes, '', gib, 1)}/{_fmt(g.memory_total_bytes, '', gib, 1)}G"
        lines.append(f"{g.index:<4}{'-':<5}{g.name[:23]:<24}"
                     f"{_fmt(g.utilization_percent, '%'):>12}{mem:>20}"
                     f"{_fmt(g.power_watts, 'W'):>8}  {g.uuid}"
                     + ("" if g.state.value == "ok" else f"  [{g.state.value}]")
                     + (f"  <- {owners[g.uuid]}" if g.uuid in owners else ""))
        for m in g.migs:
            mmem = (f"{_fmt(m.memory_used_bytes, '', gib, 1)}/"
                    f"{_fmt(m.memory_total_bytes, '', gib, 1)}G")
            lines.append(f"{'':<4}{m.gpu_instance_id:<5}{m.profile:<24}"
                         f"{_fmt(m.utilization_percent, '%'):>12}{mmem:>20}{'':>8}  {m.uuid}"
                         + (f"  <- {owners[m.uuid]}" if m.uuid in owners else ""))
        for p in g.processes:
            gi = "" if p.gpu_instance_id is None else str(p.gpu_instance_id)
            lines.append(f"{'':<4}{gi:<5}{'  pid ' + str(p.pid):<24}"
                         f"{_fmt(p.sm_util_percent, '%'):>12}"
                         f"{_fmt(p.used_memory_bytes, 'G', gib, 1):>20}")
    for problem in snap.problems:
        lines.append(f"! {problem}")
    if att is not None:
        lines.append(f"attribution: {att.state.value}"
                     + (f" ({'; '.join(att.reasons)})" if att.reasons else ""))
        for o in att.unattributed:
            lines.append(f"! pid {o.pid} on {o.gpu_uuid}: {o.reason}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
