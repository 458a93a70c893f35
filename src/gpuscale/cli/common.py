"""What every command shares: how an error reaches the person at the terminal."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuscale.common.errors import GpuscaleError
from gpuscale.stream.tls import TlsFiles

if TYPE_CHECKING:
    from gpuscale.tools.client import Target


def fail(exc: GpuscaleError | str, code: int | None = None) -> int:
    """Print ``gpuscale: <reason>`` on stderr; the exit code the error's kind maps to
    (common.errors: 2 for input that cannot be used, 1 otherwise), or ``code``."""
    print(f"gpuscale: {exc}", file=sys.stderr)
    if code is not None:
        return code
    return exc.exit_code if isinstance(exc, GpuscaleError) else 2


def tls_files(cert: Path | None, key: Path | None, ca: Path | None) -> TlsFiles | None:
    """All three TLS files, or none (ValueError for a partial set)."""
    given = [p for p in (cert, key, ca) if p is not None]
    if not given:
        return None
    if cert is None or key is None or ca is None:
        raise ValueError("TLS needs a certificate, its key and a CA: all three files")
    return TlsFiles(cert, key, ca)


def add_scaler_args(parser: Any) -> None:
    """--scaler and the client TLS flags of the operator tools (explain, top, idle)."""
    from gpuscale.tools.client import DEFAULT_SCALER, DEFAULT_SERVER_NAME

    parser.add_argument("--scaler", default=DEFAULT_SCALER,
                        help=f"the scaler's gRPC address (default {DEFAULT_SCALER}: ./dev "
                             "run's, or kubectl -n gpuscale port-forward svc/gpuscale-scaler "
                             "6000)")
    add_client_tls_args(parser, "--tls", "a scaler", DEFAULT_SERVER_NAME)


def add_client_tls_args(parser: Any, prefix: str, peer: str, server_name: str) -> None:
    """``<prefix>-cert``, ``-key``, ``-ca`` and ``-server-name``: a client's mutual TLS
    toward ``peer`` ("a scaler", "an agent")."""
    parser.add_argument(f"{prefix}-cert", type=Path,
                        help=f"client certificate for {peer} that requires mutual TLS (PEM)")
    parser.add_argument(f"{prefix}-key", type=Path, help="its private key (PEM)")
    parser.add_argument(f"{prefix}-ca", type=Path,
                        help=f"the CA that signed the certificate of {peer}")
    parser.add_argument(f"{prefix}-server-name", default=server_name,
                        help=f"the name in the certificate of {peer} ({server_name})")


def scaler_target(args: Any) -> Target:
    """The scaler the flags of add_scaler_args name. ValueError for a partial TLS set."""
    from gpuscale.tools.client import Target

    return Target(args.scaler, tls_files(args.tls_cert, args.tls_key, args.tls_ca),
                  args.tls_server_name)
