"""A client of the scaler's Inspect service, with errors a person can act on.

Every failure becomes a ToolError whose message says what to do (start a scaler, pass
--scaler, give the client certificate, ...): the commands print it, never a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message

from gpuscale.common.errors import PeerError
from gpuscale.proto import inspect_pb2 as pb
from gpuscale.proto import inspect_pb2_grpc as pb_grpc
from gpuscale.stream.tls import TlsFiles

DEFAULT_SCALER = "localhost:6000"  # ./dev run's scaler; kubectl port-forward's too
DEFAULT_SERVER_NAME = "gpuscale-scaler.gpuscale.svc"  # the deploy's scaler certificate
TIMEOUT_S = 10.0
MAX_REPLY = 256 * 1024 * 1024  # a fleet of 10,000 pods is ~4 MB


class ToolError(PeerError, RuntimeError):
    """The scaler (or Prometheus) could not be read; the message says why and what to do.
    A PeerError: exit 1, like every peer failure. ``out_of_range``: the scaler has no
    record of the moment asked for (its answer's status), so the asker can say which."""

    def __init__(self, message: str, out_of_range: bool = False) -> None:
        super().__init__(message)
        self.out_of_range = out_of_range


@dataclass(frozen=True)
class Target:
    address: str = DEFAULT_SCALER
    tls: TlsFiles | None = None
    server_name: str = DEFAULT_SERVER_NAME


_Reply = TypeVar("_Reply", bound=Message)


class InspectClient:
    def __init__(self, target: Target, timeout_s: float = TIMEOUT_S) -> None:
        self.target = target
        self._timeout = timeout_s
        options: list[tuple[str, str | int]] = [
            ("grpc.max_receive_message_length", MAX_REPLY),
            # a scaler that restarts is read again within seconds, not gRPC's 120 s
            ("grpc.initial_reconnect_backoff_ms", 250),
            ("grpc.max_reconnect_backoff_ms", 2000)]
        if target.tls is None:
            self._channel = grpc.insecure_channel(target.address, options=options)
        else:
            try:
                cert, key, ca = target.tls.read()
            except OSError as exc:
                raise ToolError(f"cannot read the TLS files: {exc}") from exc
            creds = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key,
                                                 certificate_chain=cert)
            options.append(("grpc.ssl_target_name_override", target.server_name))
            self._channel = grpc.secure_channel(target.address, creds, options=options)
        self._stub = pb_grpc.InspectStub(self._channel)  # type: ignore[no-untyped-call]

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> InspectClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def fleet(self, namespace: str = "", node: str = "") -> pb.FleetReply:
        return self._call(self._stub.Fleet, pb.FleetRequest(namespace=namespace, node=node),
                          pb.FleetReply)

    def explain(self, namespace: str, name: str, at: float = 0.0,
                history_s: float = 0.0) -> pb.ExplainReply:
        return self._call(self._stub.Explain,
                          pb.ExplainRequest(namespace=namespace, name=name, at=at,
                                            history=history_s),
                          pb.ExplainReply)

    def usage(self, window_s: float, namespace: str = "") -> pb.UsageReply:
        return self._call(self._stub.Usage,
                          pb.UsageRequest(window=window_s, namespace=namespace),
                          pb.UsageReply)

    def _call(self, method: Any, request: Message, reply: type[_Reply]) -> _Reply:
        try:
            got = method(request, timeout=self._timeout)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            raise ToolError(explain_error(self.target, exc),
                            code is grpc.StatusCode.OUT_OF_RANGE) from None
        assert isinstance(got, reply)
        return got


def explain_error(target: Target, exc: Any) -> str:
    """What went wrong (``exc``: a grpc.RpcError, which is also a grpc.Call), for a
    person: the status and what to try."""
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = (exc.details() if hasattr(exc, "details") else "") or ""
    where = f"the scaler at {target.address}"
    if code is grpc.StatusCode.UNAVAILABLE:
        hint = ("start one (./dev run starts a simulated fleet and its scaler on "
                "localhost:6000), or pass --scaler HOST:PORT (in a cluster: kubectl -n "
                "gpuscale port-forward svc/gpuscale-scaler 6000)")
        if target.tls is None and ("Socket closed" in details or "handshake" in details
                                   or "Connection reset" in details):
            hint = ("it may require mutual TLS: pass --tls-cert, --tls-key and --tls-ca "
                    "(a client certificate its CA signed, e.g. KEDA's)")
        elif target.tls is not None and ("handshake" in details.lower()
                                         or "ssl" in details.lower()):
            hint = (f"the TLS handshake failed: check that --tls-ca signed its certificate, "
                    f"that the certificate names {target.server_name} (--tls-server-name), "
                    f"and that its CA signed --tls-cert")
        return f"{where} did not answer ({details[:200] or 'unavailable'}): {hint}"
    if code is grpc.StatusCode.UNIMPLEMENTED:
        return (f"{where} does not serve gpuscale.inspect.v1.Inspect: it is an older "
                f"gpuscale, or not a gpuscale scaler")
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"{where} did not answer within the time limit ({details[:200]})"
    if code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.OUT_OF_RANGE,
                grpc.StatusCode.INVALID_ARGUMENT):
        return details[:2000]
    return f"{where} answered {code.name}: {details[:500]}"
