"""Bind a grpc.aio server's port, with one failure mode for every caller.

grpcio reports a port it cannot bind either by returning 0 (older releases) or by raising
RuntimeError (newer ones); both become OSError naming the address and, when the operating
system can tell, why and what to do ("in use": stop the other process or choose another
port), which the commands print as one line and exit 1.

grpcio sets SO_REUSEPORT on every listening socket unless told otherwise, so a second
process of the same user (a second ``gpuscale demo``) binds a port already served beside
the first and the kernel splits new connections between the two: KEDA's calls would reach
either, silently. Every gRPC server gpuscale starts is made with ``server_options``, which
turns it off; the second process then gets "in use".
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterable

import grpc

#: grpcio's own switch for SO_REUSEPORT (on by default): off on every server gpuscale runs.
NO_PORT_REUSE = ("grpc.so_reuseport", 0)


def server_options(options: Iterable[tuple[str, int]] = ()) -> list[tuple[str, int]]:
    """``options`` for a gRPC server, with port reuse off (NO_PORT_REUSE)."""
    return [*(o for o in options if o[0] != NO_PORT_REUSE[0]), NO_PORT_REUSE]


def bind(server: grpc.aio.Server, address: str,
         credentials: grpc.ServerCredentials | None = None) -> int:
    """The bound port (0 for a unix socket). Raises OSError when nothing could be bound."""
    try:
        port = (server.add_secure_port(address, credentials) if credentials is not None
                else server.add_insecure_port(address))
    except RuntimeError as exc:
        raise OSError(_why(address) or f"{address}: {str(exc).split(';')[0]}") from None
    if port == 0 and not address.startswith("unix:"):
        raise OSError(_why(address) or f"{address}: no address could be bound")
    return port


def _why(address: str) -> str:
    """Why ``address`` (host:port, [v6]:port) cannot be bound, as the operating system
    says when asked directly, with what to do; "" when it binds (or cannot be parsed):
    the caller keeps grpcio's own words."""
    host, _, port_text = address.rpartition(":")
    if address.startswith("unix:") or not port_text.isdigit():
        return ""
    host = host.strip("[]")
    try:
        found = socket.getaddrinfo(host or None, int(port_text), type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError):
        return ""
    for family, kind, proto, _, where in found:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as grpcio
                probe.bind(where)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return (f"{address}: the port is in use (another gpuscale, or another "
                        f"program, listens there): stop it or choose another port")
            if exc.errno == errno.EADDRNOTAVAIL:
                return (f"{address}: this machine has no such address: give one of its "
                        f"own (127.0.0.1, 0.0.0.0)")
            if exc.errno == errno.EACCES:
                return (f"{address}: not allowed to listen there (a port below 1024 needs "
                        f"privileges): choose a port above 1023")
            return f"{address}: {exc.strerror or exc}"
    return ""
