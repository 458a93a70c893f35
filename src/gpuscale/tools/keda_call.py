"""Ask a scaler what KEDA asks it - IsActive, GetMetricSpec or GetMetrics of
``externalscaler.ExternalScaler`` - from the request in JSON, as ``grpcurl -plaintext -d
JSON HOST:PORT externalscaler.ExternalScaler/METHOD`` would, with only what gpuscale
installs (grpcio). The reply is JSON in grpcurl's form (protobuf's JSON mapping); the
scaler's own refusal (UNAVAILABLE while data is missing) is an error that says so."""

from __future__ import annotations

import json
from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message

from gpuscale.common.errors import ConfigError
from gpuscale.proto import externalscaler_pb2 as pb
from gpuscale.proto import externalscaler_pb2_grpc as pb_grpc
from gpuscale.tools.client import InspectClient, ToolError, explain_error

#: KEDA's unary calls, each with its request message.
METHODS: dict[str, type[Message]] = {"IsActive": pb.ScaledObjectRef,
                                     "GetMetricSpec": pb.ScaledObjectRef,
                                     "GetMetrics": pb.GetMetricsRequest}
MAX_REQUEST = 64 * 1024  # a ScaledObjectRef with its trigger metadata is a few hundred bytes
# What gRPC says when nothing answered at the address (not the scaler refusing).
_UNREACHED = ("failed to connect", "connection refused", "socket closed", "handshake",
              "connection reset", "dns resolution", "deadline")


def request_from(method: str, text: str) -> Message:
    """The request of ``method`` from its JSON; ConfigError naming what is wrong."""
    if method not in METHODS:
        raise ConfigError(f"{method[:40]!r}: not one of {', '.join(METHODS)}")
    if len(text) > MAX_REQUEST:
        raise ConfigError(f"the request: larger than {MAX_REQUEST} bytes")
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"the request: not JSON ({exc})") from None
    except RecursionError:
        raise ConfigError("the request: not JSON that can be read: nested too deeply") \
            from None
    if not isinstance(doc, dict):
        raise ConfigError(f"the request: a JSON object ({METHODS[method].DESCRIPTOR.name}), "
                          f"not {type(doc).__name__}")
    try:
        return json_format.ParseDict(doc, METHODS[method]())
    except (json_format.ParseError, RecursionError) as exc:
        raise ConfigError(f"the request: not a {METHODS[method].DESCRIPTOR.name}: "
                          f"{' '.join(str(exc).split())[:200]}") from None


class KedaClient(InspectClient):
    """The scaler's KEDA service on the Inspect client's channel (same TLS, same
    timeout)."""

    def ask(self, method: str, request: Message) -> str:
        stub: Any = pb_grpc.ExternalScalerStub(self._channel)  # type: ignore[no-untyped-call]
        try:
            reply = getattr(stub, method)(request, timeout=self._timeout)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
            details = (exc.details() if hasattr(exc, "details") else "") or ""
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) and \
                    any(w in details.lower() for w in _UNREACHED):
                raise ToolError(explain_error(self.target, exc)) from None
            raise ToolError(f"the scaler at {self.target.address} answered {code.name}: "
                            f"{details[:500]}") from None
        return json_format.MessageToJson(reply, indent=2)
