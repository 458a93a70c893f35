"""The errors gpuscale raises on purpose, as one small hierarchy.

Every error a caller may want to handle derives from ``GpuscaleError`` and from one of five
kinds, each of which the edges answer the same way wherever it comes from:

===================== ================================== ===== ================ ========
kind                  meaning                            gRPC  HTTP             CLI exit
===================== ================================== ===== ================ ========
``ConfigError``       an operator's or a caller's input  INVALID_ARGUMENT 400   2
                      cannot be used (metadata, config,
                      scenario, trace, selector)
``DataUnavailable``   an honest answer needs data that   UNAVAILABLE      503   1
                      is missing, stale or unsupported
``PeerError``         a peer (kubelet, NVML, the API     UNAVAILABLE      502   1
                      server, an agent, an engine) failed
                      or answered something unusable
``Overloaded``        a caller asks for more than a      RESOURCE_EXHAUSTED 429 1
                      bound allows (the stream budget)
``Superseded``        a newer request took this one's    ABORTED          409   1
                      place (a KEDA stream replaced)
===================== ================================== ===== ================ ========

The mapping is data (``grpc_code``, ``http_status``, ``exit_code`` on each class), read by
the edges in one place each (``scaler.edges.keda`` for gRPC, the CLI's ``fail``), so no edge
imports another's library to classify an error. Errors that already derived from
``ValueError`` keep doing so: callers written against the standard types still work.

``Unavailable`` is the same "cannot know" as a value, for functions that return either
what they found or why there is none (``Selector | Unavailable``, ``Plan | Unavailable``):
a typed reason, never a bare string, ``None`` or a zero. ``DataUnavailable`` carries one.
"""

from __future__ import annotations

from dataclasses import dataclass


class GpuscaleError(Exception):
    """Base of every error gpuscale raises on purpose; the message is meant for a person."""

    grpc_code = "INTERNAL"
    http_status = 500
    exit_code = 1


class ConfigError(GpuscaleError, ValueError):
    """Input given to gpuscale cannot be used; the message names the key or file and what
    would be accepted."""

    grpc_code = "INVALID_ARGUMENT"
    http_status = 400
    exit_code = 2


class DataUnavailable(GpuscaleError):
    """The data for an honest answer is missing, stale or unsupported; the message names
    what is missing and why (KEDA's fallback, or the HPA, holds the replicas meanwhile)."""

    grpc_code = "UNAVAILABLE"
    http_status = 503


@dataclass(frozen=True, slots=True)
class Unavailable:
    """No honest value now; ``reason`` says what is missing and why, for a person."""

    reason: str

    def error(self) -> DataUnavailable:
        """The same, raised where a caller expects an exception (KEDA's UNAVAILABLE)."""
        return DataUnavailable(self.reason)


class PeerError(GpuscaleError):
    """A peer failed or answered something unusable (too large, malformed, an error)."""

    grpc_code = "UNAVAILABLE"
    http_status = 502


class Overloaded(GpuscaleError):
    """A caller asks for more than its share; the message says the limit and what to do."""

    grpc_code = "RESOURCE_EXHAUSTED"
    http_status = 429


class Superseded(GpuscaleError):
    """A newer request took this one's place (a KEDA stream replaced by a newer one of the
    same trigger); the message says by what."""

    grpc_code = "ABORTED"
    http_status = 409
