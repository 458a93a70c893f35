"""``gpuscale agent``: the node agent (sampler, /metrics, telemetry stream)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from gpuscale.agent.app import DEFAULT_METRICS_PORT, DEFAULT_STREAM_PORT
from gpuscale.cli.backend import add_backend_args, make_backend, make_sources
from gpuscale.cli.common import fail, tls_files
from gpuscale.common.errors import ConfigError
from gpuscale.engines.scrape import MAX_BODY_BYTES

# Engine bodies: below 4 KiB not even a small vLLM answer fits; above 64 MiB a few pods
# would exceed the agent's memory limit.
MIN_ENGINE_BODY = 4096
MAX_ENGINE_BODY = 64 * 1024 * 1024


def add_parser(sub: Any) -> None:
    agent = sub.add_parser("agent", help="run the node agent (sampler + /metrics)")
    add_backend_args(agent)
    agent.add_argument("--interval", type=float, default=1.0,
                       help="sample interval in seconds (0.2 or more; default 1)")
    agent.add_argument("--host", default="0.0.0.0", help="listen address (default 0.0.0.0)")
    agent.add_argument("--port", type=int, default=DEFAULT_METRICS_PORT,
                       help=f"metrics port (default {DEFAULT_METRICS_PORT})")
    agent.add_argument("--stream-port", type=int, default=DEFAULT_STREAM_PORT,
                       help=f"telemetry stream for scalers (default {DEFAULT_STREAM_PORT}; "
                            "-1: off)")
    agent.add_argument("--stream-tls-cert", type=Path, help="stream server certificate (PEM)")
    agent.add_argument("--stream-tls-key", type=Path, help="its private key (PEM)")
    agent.add_argument("--stream-tls-ca", type=Path,
                       help="CA that signs the scalers' client certificates (PEM)")
    agent.add_argument("--stream-insecure", action="store_true",
                       help="serve the stream in plaintext (only on trusted networks)")
    agent.add_argument("--hostname", default="",
                       help="Hostname label on dcgm series (default: $NODE_NAME, else this "
                            "host's name)")
    agent.add_argument("--engine-max-body-bytes", type=int, default=MAX_BODY_BYTES,
                       metavar="BYTES",
                       help="largest engine /metrics body the agent reads; a larger one "
                            "makes that pod's engine signals UNAVAILABLE "
                            f"({MIN_ENGINE_BODY}-{MAX_ENGINE_BODY}; default {MAX_BODY_BYTES})")
    agent.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from gpuscale.agent.app import Agent, AgentConfig, run_until_signalled

    try:
        tls = tls_files(args.stream_tls_cert, args.stream_tls_key, args.stream_tls_ca)
    except ValueError as exc:
        return fail(str(exc))
    if not MIN_ENGINE_BODY <= args.engine_max_body_bytes <= MAX_ENGINE_BODY:
        return fail(f"--engine-max-body-bytes must be between {MIN_ENGINE_BODY} and "
                    f"{MAX_ENGINE_BODY}, got {args.engine_max_body_bytes}")
    if args.stream_port >= 0 and tls is None and not args.stream_insecure:
        return fail("the telemetry stream needs --stream-tls-cert, --stream-tls-key and "
                    "--stream-tls-ca (mutual TLS), or --stream-insecure, or --stream-port -1")
    try:
        backend = make_backend(args)
    except ConfigError as exc:
        return fail(exc)
    agent: Agent | None = None

    def listening(port: int) -> None:
        host = "localhost" if args.host in ("0.0.0.0", "::") else args.host
        stream = f"; telemetry stream on :{agent.stream_port}" if agent and \
            agent.stream_port else ""
        print(f"gpuscale agent ({backend.name} backend) serving metrics at "
              f"http://{host}:{port}/metrics (health: /healthz, /readyz){stream}", flush=True)

    async def serve() -> None:
        nonlocal agent
        sources = await make_sources(args, backend)
        agent = Agent(backend, AgentConfig(args.host, args.port, args.interval, args.hostname,
                                           None if args.stream_port < 0 else args.stream_port,
                                           tls, args.engine_max_body_bytes), sources)
        await run_until_signalled(agent, listening)

    try:
        asyncio.run(serve())
    except ValueError as exc:  # ConfigError (ScenarioError) is one
        return fail(str(exc), 2)
    except OSError as exc:
        return fail(f"cannot serve on {args.host}:{args.port}: {exc}", 1)
    return 0
