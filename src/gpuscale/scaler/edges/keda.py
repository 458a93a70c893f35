"""KEDA's ExternalScaler over gRPC, answered from the fleet view in memory.

Status codes: INVALID_ARGUMENT for metadata that cannot be used (the message names the key
and the choices), for a namespace or name that cannot be a Kubernetes object's, and for a
metric name this trigger does not have; UNAVAILABLE when the workload's value cannot be
given honestly (KEDA then applies its fallback); RESOURCE_EXHAUSTED for a stream past the
scaler's stream budget, ABORTED for a stream that a newer one of the same kind and trigger
replaced (scaler.state.streams: one live stream per trigger, none capped per connection,
since KEDA puts every ScaledObject on one connection); INTERNAL (logged with its
traceback, counted as such) for a bug. Nothing here does I/O: no NVML, no scrape, no
Kubernetes API call on the request path.

Reflection is served as ``grpc.reflection.v1`` (what grpcurl asks first) and
``v1alpha``: the two protocols have the same messages on the wire, so one implementation
answers both.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

from gpuscale.common.errors import (
    ConfigError,
    DataUnavailable,
    GpuscaleError,
    Unavailable,
)
from gpuscale.common.grpc_abort import forgets_request, stream_forgets_request
from gpuscale.common.grpc_bind import bind, server_options
from gpuscale.proto import externalscaler_pb2 as pb
from gpuscale.proto import externalscaler_pb2_grpc as pb_grpc
from gpuscale.scaler import DEFAULT_PORT
from gpuscale.scaler.answers import Answers, Workload
from gpuscale.scaler.core.trigger import (
    MAX_TOTAL,
    TriggerConfig,
    check_object_name,
    parse_metadata,
)
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.scaler.state.history import TriggerHistory
from gpuscale.scaler.state.plan_book import PlanBook
from gpuscale.scaler.state.pushes import ActivityPushes
from gpuscale.scaler.state.streams import Held, StreamBook

log = logging.getLogger(__name__)

STREAM_RESEND_S = 30.0  # StreamIsActive re-sends the current state at least this often
UNAVAILABLE_GRACE_S = 3.0  # StreamIsActive ends with UNAVAILABLE after this long unknown
SERVICE = "externalscaler.ExternalScaler"
REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"
UNARY_ROOM = 10_000  # unary calls one connection may have in flight beside every stream
MAX_PENDING_CALLS = 20_000  # arrived, not yet picked up by the server (a burst of streams)
MAX_VALUE = 9.2e15  # KEDA's quantities are exact below this; nothing real is near it
# The largest request KEDA can send that this scaler would not refuse anyway: a
# GetMetricsRequest whose ScaledObjectRef carries metadata at parse_metadata's bound
# (MAX_TOTAL characters, up to 4 bytes each in UTF-8), a name (<= 253) and namespace
# (<= 63), a metric name and protobuf's framing, with room to spare. KEDA's client sets
# no send limit of its own (grpc.NewClient with a service config only), so this is the
# bound: a larger message is refused by gRPC itself (RESOURCE_EXHAUSTED) before any of it
# reaches Python, and what a refused call costs stays this small.
MAX_MESSAGE = 4 * MAX_TOTAL + 16 * 1024  # 80 KiB
MAX_DETAILS = 1024  # characters of a status message: reasons never echo a request whole

Context = grpc.aio.ServicerContext[Any, Any]

_Reply = TypeVar("_Reply")
Count = Callable[[str, str], None]  # (method, status code name) -> record one answer


class _Answered:
    """Counts every RPC's outcome (OK, INVALID_ARGUMENT, UNAVAILABLE, ...) by method."""

    def __init__(self, count: Count | None) -> None:
        self._count = count

    def __call__(self, method: str, context: Context) -> None:
        if self._count is not None:
            code = context.code()
            self._count(method, code.name if code is not None else "OK")


class ScalerService(pb_grpc.ExternalScalerServicer):
    def __init__(self, answers: Answers, resend_s: float = STREAM_RESEND_S,
                 count: Count | None = None, streams: StreamBook | None = None) -> None:
        """``answers``: the scaler's one answer function over its fleet view, roster,
        resolver, plan book and demand sources; ``streams``: the bounds on long-lived
        streams (default budget when None)."""
        self.answers = answers
        self.history = TriggerHistory()  # what KEDA asks about (the recorder fills it)
        self._answered = _Answered(count)
        self.unavailable_grace_s = UNAVAILABLE_GRACE_S
        self.streams = streams if streams is not None else StreamBook()
        self.stopping = asyncio.Event()
        self.pushes = ActivityPushes(lambda: answers.fleet.generation, self.stopping,
                                     resend_s, lambda: self.unavailable_grace_s)

    @property
    def fleet(self) -> FleetView:
        return self.answers.fleet

    @property
    def plans(self) -> PlanBook:
        return self.answers.plans

    # -- helpers: pure, raising GpuscaleError; the methods below map it to a status -----

    def _workload(self, ref: pb.ScaledObjectRef) -> Workload:
        check_object_name(ref.namespace, ref.name)
        cfg = parse_metadata(ref.scalerMetadata)  # MetadataError
        workload = Workload(ref.namespace, ref.name, cfg)
        self.answers.check(workload)  # ConfigError
        # A trigger this scaler accepts: remembered for the operator tools (O(1)).
        self.history.note(ref.namespace, ref.name, ref.scalerMetadata, cfg, self.fleet.now())
        return workload

    @contextmanager
    def _stream_slot(self, kind: str, ref: pb.ScaledObjectRef,
                     context: Context) -> Iterator[Held]:
        """Hold the trigger's place for a stream of ``kind`` (scaler.state.streams): a
        newer stream of the same identity replaces this one; past the budget,
        RESOURCE_EXHAUSTED."""
        held = self.streams.hold(kind, ref.namespace, ref.name, ref.scalerMetadata,
                                 context.peer() or "unknown")
        try:
            yield held
        finally:
            self.streams.release(held)

    def _active(self, workload: Workload) -> bool:
        """IsActive (scaler.answers). Raises DataUnavailable."""
        got = self.answers.active(workload)
        if isinstance(got, Unavailable):
            raise got.error()
        return got

    def _spec(self, cfg: TriggerConfig) -> pb.GetMetricSpecResponse:
        return pb.GetMetricSpecResponse(metricSpecs=[
            pb.MetricSpec(metricName=cfg.metric_name(t), targetSize=max(1, round(t.target)),
                          targetSizeFloat=t.target) for t in cfg.targets])

    def _metrics(self, request: pb.GetMetricsRequest) -> pb.GetMetricsResponse:
        workload = self._workload(request.scaledObjectRef)
        cfg = workload.trigger
        target = cfg.target_for(request.metricName)
        if target is None:
            raise ConfigError(f"metricName: {request.metricName[:100]!r} is not one of "
                              f"{', '.join(cfg.metric_name(t) for t in cfg.targets)}")
        got = self.answers.value(workload, target)
        if isinstance(got, Unavailable):
            raise got.error()
        value = min(got.value, MAX_VALUE)  # beyond: maxReplicas anyway
        return pb.GetMetricsResponse(metricValues=[pb.MetricValue(
            metricName=request.metricName, metricValue=round(value),
            metricValueFloat=value)])

    # -- the contract --------------------------------------------------------------------

    async def _unary(self, method: str, context: Context, ref: pb.ScaledObjectRef,
                     answer: Callable[[], _Reply]) -> _Reply:
        """One unary call: the answer, or its error as a status (a bug as INTERNAL,
        logged); every outcome counted."""
        try:
            return answer()
        except GpuscaleError as exc:
            await abort(context, exc, ref)
        except Exception as exc:  # a bug: INTERNAL, logged, never counted as OK
            await internal(context, method, exc)
        finally:
            self._answered(method, context)
        raise AssertionError("unreachable")

    @forgets_request
    async def IsActive(self, request: pb.ScaledObjectRef,
                       context: Context) -> pb.IsActiveResponse:
        return await self._unary("IsActive", context, request, lambda: pb.IsActiveResponse(
            result=self._active(self._workload(request))))

    @stream_forgets_request
    async def StreamIsActive(self, request: pb.ScaledObjectRef,
                             context: Context) -> AsyncGenerator[pb.IsActiveResponse, None]:
        """Push the state when it changes (driven by fleet updates) and at least every
        ``resend_s``; KEDA acts on pushed ``true`` at once. When the state cannot be known
        for ``unavailable_grace_s``, the stream ends with UNAVAILABLE and the reason, so
        the last pushed answer does not stand for a state nobody knows (KEDA reopens the
        stream with backoff; its polling path meanwhile gets UNAVAILABLE too)."""
        try:
            workload = self._workload(request)
            with self._stream_slot("StreamIsActive", request, context) as held:
                async for answer in self._active_stream(workload, held):
                    yield answer
        except GpuscaleError as exc:
            await abort(context, exc, request)

    async def _active_stream(self, workload: Workload,
                             held: Held) -> AsyncIterator[pb.IsActiveResponse]:
        """Decided by the push loop (scaler.state.pushes), which wakes this stream only
        when it has something to send (or a newer stream replaced it)."""
        sub = self.pushes.open(workload, lambda: self._active(workload))
        held.watch(sub.end)
        try:
            while (active := await sub.next()) is not None:
                yield pb.IsActiveResponse(result=active)
        finally:
            self.pushes.close(sub)

    @forgets_request
    async def GetMetricSpec(self, request: pb.ScaledObjectRef,
                            context: Context) -> pb.GetMetricSpecResponse:
        return await self._unary("GetMetricSpec", context, request,
                                 lambda: self._spec(self._workload(request).trigger))

    @stream_forgets_request
    async def StreamMetricSpec(self, request: pb.ScaledObjectRef,
                               context: Context,
                               ) -> AsyncGenerator[pb.GetMetricSpecResponse, None]:
        """The spec at once (KEDA's first rule); it depends only on the metadata, which a
        stream cannot change, so GetMetricSpec for the same reference always equals it
        (the second rule) and the stream then stays open with nothing to re-send until
        the scaler shuts down or a newer stream for the same trigger replaces it."""
        try:
            spec = self._spec(self._workload(request).trigger)
            with self._stream_slot("StreamMetricSpec", request, context) as held:
                yield spec
                await _first(self.stopping, held.ended)
                if held.reason is not None:
                    raise held.reason
        except GpuscaleError as exc:
            await abort(context, exc, request)

    @forgets_request
    async def GetMetrics(self, request: pb.GetMetricsRequest,
                         context: Context) -> pb.GetMetricsResponse:
        return await self._unary("GetMetrics", context, request.scaledObjectRef,
                                 lambda: self._metrics(request))


async def _first(*events: asyncio.Event) -> None:
    """Wait until any of ``events`` is set."""
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


async def abort(context: Context, exc: GpuscaleError, ref: pb.ScaledObjectRef) -> None:
    """The one place a gpuscale error becomes a gRPC status (common.errors says which):
    INVALID_ARGUMENT for input that cannot be used, UNAVAILABLE for missing data (KEDA then
    applies its fallback). Unavailable answers name the ScaledObject."""
    message = str(exc)
    if isinstance(exc, DataUnavailable):
        message = f"{ref.namespace}/{ref.name}: {message}"
    await context.abort(grpc.StatusCode[exc.grpc_code], _cut(message))


def _cut(message: str) -> str:
    """At most MAX_DETAILS characters: a status message rides in a header (a client
    refuses headers past its own limit, 8 KiB by default in gRPC) and is logged by KEDA."""
    return message if len(message) <= MAX_DETAILS else f"{message[:MAX_DETAILS - 3]}..."


async def internal(context: Context, method: str, exc: Exception) -> None:
    """A bug reached the edge: log it with its traceback, answer INTERNAL (KEDA counts a
    failure and, past its threshold, applies the fallback)."""
    log.error("%s failed: %s", method, _cut(str(exc)), exc_info=exc)
    await context.abort(grpc.StatusCode.INTERNAL,
                        f"internal error in gpuscale ({type(exc).__name__}); see the "
                        f"scaler's log")


def enable_reflection(server: grpc.aio.Server, services: tuple[str, ...]) -> None:
    """Server reflection v1alpha and v1 (same messages on the wire, one implementation)."""
    servicer = reflection.aio.ReflectionServicer(
        (*services, reflection.SERVICE_NAME, REFLECTION_V1))
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(REFLECTION_V1, {
        "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
            servicer.ServerReflectionInfo,
            request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
            response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString),
    }),))


def add_to_server(service: ScalerService, server: Any) -> None:
    """Register ExternalScaler (a grpc server, or anything with its add_* methods)."""
    pb_grpc.add_ExternalScalerServicer_to_server(service, server)  # type: ignore[no-untyped-call]


class ScalerServer:
    """The gRPC server: ExternalScaler, health checking and reflection, one port."""

    def __init__(self, service: ScalerService, host: str = "[::]",
                 port: int = DEFAULT_PORT,
                 credentials: grpc.ServerCredentials | None = None,
                 extra: Sequence[tuple[str, Callable[[grpc.aio.Server], None]]] = ()) -> None:
        """``extra``: more services on the same port and credentials, each (full name,
        registration)."""
        self.service = service
        self.health = HealthServicer()
        self._server = grpc.aio.server(options=self.options(service))
        add_to_server(service, self._server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        for _, register in extra:
            register(self._server)
        enable_reflection(self._server,
                          (SERVICE, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                           *(name for name, _ in extra)))
        address = host if host.startswith("unix:") else f"{host}:{port}"
        self.port = bind(self._server, address, credentials)
        self.serving = False  # serve() began (and will stop it)

    @staticmethod
    def options(service: ScalerService) -> list[tuple[str, int]]:
        """The gRPC server's options (also for benches that build a bare server)."""
        return server_options([
            ("grpc.max_receive_message_length", MAX_MESSAGE),
            # Every stream the budget allows may share one connection (KEDA's), with room
            # for unary calls beside them: gRPC queues calls past this per connection.
            ("grpc.max_concurrent_streams", service.streams.max_streams() + UNARY_ROOM),
            # Calls that arrived and that the asyncio server has not picked up yet: gRPC's
            # defaults (1,000 soft, 3,000 hard) cancel part of a burst - KEDA re-opening
            # thousands of streams after a restart lost a third of them (bench_streams).
            ("grpc.server.max_pending_requests", MAX_PENDING_CALLS),
            ("grpc.server.max_pending_requests_hard_limit", 2 * MAX_PENDING_CALLS)])

    async def start(self) -> None:
        await self._server.start()
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        await self.health.set(SERVICE, health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace: float = 5.0) -> None:
        """Graceful: report NOT_SERVING, end the streams, let unary calls finish."""
        await self.health.enter_graceful_shutdown()
        self.service.stopping.set()
        await self._server.stop(grace)

    async def serve(self, on_listening: Callable[[int], None] | None = None) -> None:
        """Serve until cancelled, then stop. ``serving`` says it began: a server whose
        serving task was cancelled before its first step is its owner's to stop."""
        self.serving = True
        try:
            await self.start()
            if on_listening is not None:
                on_listening(self.port)
            await self._server.wait_for_termination()
        finally:
            await asyncio.shield(self.stop())
