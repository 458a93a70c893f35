"""``gpuscale scaler``: the KEDA external scaler, fed by every agent's telemetry stream."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gpuscale.cli.common import fail, tls_files
from gpuscale.scaler import DEFAULT_PORT


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
    sc.add_argument("--history-step", type=float, default=30.0,
                    help="seconds between the moments recorded for gpuscale explain --at "
                         "(30; one hour is kept; devices are sampled every 15 s, or this "
                         "if shorter)")
    sc.add_argument("--metrics-api-port", type=int, default=0,
                    help="serve custom.metrics.k8s.io for a plain HPA on this port (HTTPS, "
                         "behind an APIService; needs the API); 0: off")
    sc.add_argument("--metrics-api-cert", type=Path,
                    help="the metrics API's serving certificate (PEM)")
    sc.add_argument("--metrics-api-key", type=Path, help="its private key (PEM)")
    sc.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from gpuscale.scaler.root import run_scaler

    try:
        args.agent_tls = tls_files(args.agent_tls_cert, args.agent_tls_key, args.agent_tls_ca)
        args.tls = tls_files(args.tls_cert, args.tls_key, args.tls_ca)
    except ValueError as exc:
        return fail(str(exc))
    if not 0.1 <= args.history_step <= 3600:
        return fail(f"--history-step: {args.history_step:g} is not 0.1..3600 seconds")
    extras = []
    if args.metrics_api_port:
        if not (args.metrics_api_cert and args.metrics_api_key):
            return fail("--metrics-api-port needs --metrics-api-cert and --metrics-api-key "
                        "(the APIService's caBundle must be their CA)")
        from gpuscale.metrics_api.main import MetricsApiOptions, metrics_api

        extras.append(metrics_api(MetricsApiOptions(
            args.host, args.metrics_api_port, args.metrics_api_cert, args.metrics_api_key),
            lambda port: print(f"gpuscale metrics API (custom.metrics.k8s.io) on "
                               f"{args.host}:{port}", flush=True)))
    return run_scaler(args, extras, needs_api=bool(extras))
