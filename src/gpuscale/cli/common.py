"""What every command shares: how an error reaches the person at the terminal."""

from __future__ import annotations

import sys
from pathlib import Path

from gpuscale.common.errors import GpuscaleError
from gpuscale.stream.tls import TlsFiles


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
