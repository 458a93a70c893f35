"""Bind a grpc.aio server's port, with one failure mode for every caller.

grpcio reports a port it cannot bind either by returning 0 (older releases) or by raising
RuntimeError (newer ones); both become OSError naming the address, which the commands
turn into "cannot listen" and exit 1.
"""

from __future__ import annotations

import grpc


def bind(server: grpc.aio.Server, address: str,
         credentials: grpc.ServerCredentials | None = None) -> int:
    """The bound port (0 for a unix socket). Raises OSError when nothing could be bound."""
    try:
        port = (server.add_secure_port(address, credentials) if credentials is not None
                else server.add_insecure_port(address))
    except RuntimeError as exc:
        raise OSError(f"{address}: {str(exc).split(';')[0]}") from None
    if port == 0 and not address.startswith("unix:"):
        raise OSError(f"{address}: no address could be bound")
    return port
