"""Mutual TLS for the agent <-> scaler stream, from PEM files that may be rotated.

The agent's server credentials re-read the certificate, key and client CA whenever one of
the files changes (checked at each new connection); the scaler's client credentials are
read afresh for each connection attempt, so rotated files take effect on the next
reconnect. Agents are dialled by IP, so the scaler checks the agent certificate against a
fixed name (``server_name``, default ``gpuscale-agent``) that the certificate must carry.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc

log = logging.getLogger(__name__)

DEFAULT_SERVER_NAME = "gpuscale-agent"


@dataclass(frozen=True, slots=True)
class TlsFiles:
    cert: Path
    key: Path
    ca: Path

    def read(self) -> tuple[bytes, bytes, bytes]:
        return self.cert.read_bytes(), self.key.read_bytes(), self.ca.read_bytes()

    def stamp(self) -> tuple[int, ...]:
        return tuple(p.stat().st_mtime_ns for p in (self.cert, self.key, self.ca))


def server_credentials(files: TlsFiles) -> grpc.ServerCredentials:
    """Server credentials that require a client certificate signed by ``files.ca``."""
    cert, key, ca = files.read()
    stamp = [files.stamp()]

    def config(cert: bytes, key: bytes, ca: bytes) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        try:
            now = files.stamp()
            if now == stamp[0]:
                return None
            cfg = config(*files.read())
        except OSError as exc:
            log.warning("TLS files unreadable, keeping the current ones: %s", exc)
            return None
        stamp[0] = now
        log.info("TLS certificate reloaded from %s", files.cert)
        return cfg

    # gRPC's contract: the callback returns None when nothing changed (the stubs say
    # otherwise).
    return grpc.dynamic_ssl_server_credentials(config(cert, key, ca), fetch,  # type: ignore[arg-type]
                                               require_client_authentication=True)


def channel_credentials(files: TlsFiles) -> Callable[[], grpc.ChannelCredentials]:
    """A function giving fresh client credentials (re-reading the files) per connection."""
    def make() -> grpc.ChannelCredentials:
        cert, key, ca = files.read()
        return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key,
                                            certificate_chain=cert)
    return make
