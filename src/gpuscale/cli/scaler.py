"""``gpuscale scaler``: the KEDA external scaler, fed by every agent's telemetry stream."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuscale.cli.common import fail, tls_files
from gpuscale.common.errors import ConfigError
from gpuscale.scaler import DEFAULT_PORT
from gpuscale.scaler.state.streams import MEMORY_BUDGET_MIB

if TYPE_CHECKING:
    from gpuscale.scaler.config import ScalerConfig


def add_parser(sub: Any) -> None:
    sc = sub.add_parser("scaler", help="the KEDA external scaler, fed by every agent's "
                                       "telemetry stream")
    sc.add_argument("--host", default="0.0.0.0", help="listen address")
    sc.add_argument("--port", type=int, default=DEFAULT_PORT,
                    help=f"gRPC port ({DEFAULT_PORT})")
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
                    help="scaler configuration YAML (demand sources, advisory workloads)")
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
    sc.add_argument("--history-step", type=float, default=30.0,
                    help="seconds between the moments recorded for gpuscale explain --at "
                         "(30; one hour is kept; devices are sampled every 15 s, or this "
                         "if shorter)")
    sc.add_argument("--stream-memory-mib", type=int, default=MEMORY_BUDGET_MIB,
                    help=f"memory the scaler may spend on KEDA's open streams "
                         f"({MEMORY_BUDGET_MIB}: about 8,700; each is about 30 KB, 40 KB in "
                         f"both processes with --answer-process); past it "
                         f"new streams get RESOURCE_EXHAUSTED. Keep it and the scaler's "
                         f"own ~200 MiB (1,000 agents) under its memory limit")
    sc.add_argument("--answer-process", action="store_true",
                    help="serve KEDA's gRPC port from a child process that relays each "
                         "call to this one: the per-call garbage of gRPC's server stays "
                         "out of the fleet view's collector (shorter pauses at thousands "
                         "of ScaledObjects; BENCHMARKS.md)")
    sc.add_argument("--metrics-api-port", type=int, default=0,
                    help="serve custom.metrics.k8s.io for a plain HPA on this port (HTTPS, "
                         "behind an APIService; needs the API); 0: off")
    sc.add_argument("--metrics-api-cert", type=Path,
                    help="the metrics API's serving certificate (PEM)")
    sc.add_argument("--metrics-api-key", type=Path, help="its private key (PEM)")
    sc.set_defaults(run=run)


def config_of(args: argparse.Namespace) -> ScalerConfig:
    """The scaler's typed configuration from its command line. ConfigError for options
    that cannot be used together or files that cannot be read."""
    from gpuscale.scaler.config import ScalerConfig, load_file
    from gpuscale.scaler.sources.demand import DemandConfig

    try:
        agent_tls = tls_files(args.agent_tls_cert, args.agent_tls_key, args.agent_tls_ca)
        tls = tls_files(args.tls_cert, args.tls_key, args.tls_ca)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if not args.agents and not args.agent_service:
        raise ConfigError("give --agents HOST:PORT,... or --agent-service NAMESPACE/NAME")
    if agent_tls is None and not args.agents_insecure:
        raise ConfigError("agent streams need --agent-tls-cert, --agent-tls-key and "
                          "--agent-tls-ca (mutual TLS), or --agents-insecure")
    if not 0.1 <= args.history_step <= 3600:
        raise ConfigError(f"--history-step: {args.history_step:g} is not 0.1..3600 seconds")
    if not 1 <= args.stream_memory_mib <= 1024 * 1024:
        raise ConfigError(f"--stream-memory-mib: {args.stream_memory_mib} is not "
                          f"1..1048576")
    if args.metrics_api_port and not (args.metrics_api_cert and args.metrics_api_key):
        raise ConfigError("--metrics-api-port needs --metrics-api-cert and "
                          "--metrics-api-key (the APIService's caBundle must be their CA)")
    demand, advisory = load_file(args.config) if args.config else (DemandConfig(), ())
    return ScalerConfig(
        host=args.host, port=args.port, metrics_port=args.metrics_port, tls=tls,
        agents=tuple(args.agents), agent_service=args.agent_service,
        agent_port=args.agent_port, agent_tls=agent_tls,
        agent_tls_server_name=args.agent_tls_server_name,
        # the metrics API answers for Deployments and StatefulSets: it needs their watches
        resolve_targets=args.resolve_targets or bool(args.metrics_api_port),
        kubeconfig=args.kubeconfig,
        demand=demand, advisory=advisory,
        history_step_s=args.history_step, stream_memory_mib=args.stream_memory_mib,
        answer_process=args.answer_process)


def run(args: argparse.Namespace) -> int:
    from gpuscale.scaler.root import Component, serve

    try:
        config = config_of(args)
    except ConfigError as exc:
        return fail(exc)
    components: list[Component] = []
    if args.metrics_api_port:
        from gpuscale.metrics_api.main import MetricsApi, MetricsApiOptions

        components.append(MetricsApi(MetricsApiOptions(
            args.host, args.metrics_api_port, args.metrics_api_cert, args.metrics_api_key),
            lambda port: print(f"gpuscale metrics API (custom.metrics.k8s.io) on "
                               f"{args.host}:{port}", flush=True)))
    try:
        asyncio.run(serve(config, components, needs_api=bool(components)))
    except ConfigError as exc:
        return fail(exc)
    except OSError as exc:
        return fail(str(exc), 1)
    return 0
