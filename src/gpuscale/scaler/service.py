"""KEDA's ExternalScaler over gRPC, answered from the fleet view in memory.

Status codes: INVALID_ARGUMENT for metadata that cannot be used (the message names the key
and the choices) and for a metric name this trigger does not have; UNAVAILABLE when the
workload's value cannot be given honestly (KEDA then applies its fallback). Nothing here
does I/O: no NVML, no scrape, no Kubernetes API call on the request path.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from gpuscale.common.errors import ConfigError, DataUnavailable, GpuscaleError
from gpuscale.common.grpc_bind import bind
from gpuscale.proto import externalscaler_pb2 as pb
from gpuscale.proto import externalscaler_pb2_grpc as pb_grpc
from gpuscale.scaler.evaluate import WorkloadUnavailable, evaluate
from gpuscale.scaler.fleet import FleetView
from gpuscale.scaler.metadata import TriggerConfig, parse_metadata
from gpuscale.scaler.profiles import Target
from gpuscale.stream.records import PodRecord

if TYPE_CHECKING:  # the Kubernetes client is imported only where the resolver is built
    from gpuscale.scaler.workloads import WorkloadResolver

log = logging.getLogger(__name__)

DEFAULT_PORT = 6000
STREAM_RESEND_S = 30.0  # StreamIsActive re-sends the current state at least this often
SERVICE = "externalscaler.ExternalScaler"

Context = grpc.aio.ServicerContext[Any, Any]
DemandCheck = Callable[[str], bool | None]  # demand source name -> pending work? (None: unknown)


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
    def __init__(self, fleet: FleetView, demand: DemandCheck | None = None,
                 resend_s: float = STREAM_RESEND_S,
                 workloads: WorkloadResolver | None = None,
                 count: Count | None = None) -> None:
        self.fleet = fleet
        self._answered = _Answered(count)
        self._demand = demand
        self._workloads = workloads
        self._resend_s = resend_s
        self.stopping = asyncio.Event()

    # -- helpers: pure, raising GpuscaleError; the methods below map it to a status -----

    def _config(self, ref: pb.ScaledObjectRef) -> TriggerConfig:
        cfg = parse_metadata(ref.scalerMetadata)  # MetadataError
        if cfg.selector is None and self._workloads is None:
            raise ConfigError("podSelector: required (label selector of the workload's pods, "
                              "e.g. app=vllm); resolving scaleTargetRef through the API is "
                              "not enabled in this scaler")
        if cfg.demand_source and self._demand is not None and \
                self._demand(cfg.demand_source) is None:
            raise ConfigError(f"demandSource: {cfg.demand_source!r} is not declared in the "
                              f"scaler's configuration")
        return cfg

    def _pods(self, ref: pb.ScaledObjectRef, cfg: TriggerConfig) -> list[PodRecord]:
        """The workload's pods: podSelector, else the ScaledObject's scale target's
        selector (from the watches). Raises WorkloadUnavailable."""
        selector = cfg.selector
        if selector is None:
            assert self._workloads is not None
            resolved = self._workloads.resolve(ref.namespace, ref.name)
            if isinstance(resolved, str):
                raise WorkloadUnavailable(f"scale target: {resolved}")
            selector = resolved
        return self.fleet.select(ref.namespace, selector)

    def _value(self, ref: pb.ScaledObjectRef, cfg: TriggerConfig, target: Target) -> float:
        return evaluate(self.fleet, self._pods(ref, cfg), target, cfg.value_mode).value

    def _active(self, ref: pb.ScaledObjectRef, cfg: TriggerConfig) -> bool:
        """Active when any target's value is strictly above its activation threshold, or
        the demand source shows pending work. Raises WorkloadUnavailable."""
        if cfg.demand_source and self._demand is not None and self._demand(cfg.demand_source):
            return True
        pods = self._pods(ref, cfg)
        return any(evaluate(self.fleet, pods, t, cfg.value_mode).value > t.activation
                   for t in cfg.targets)

    def _spec(self, cfg: TriggerConfig) -> pb.GetMetricSpecResponse:
        return pb.GetMetricSpecResponse(metricSpecs=[
            pb.MetricSpec(metricName=cfg.metric_name(t), targetSize=max(1, round(t.target)),
                          targetSizeFloat=t.target) for t in cfg.targets])

    def _metrics(self, request: pb.GetMetricsRequest) -> pb.GetMetricsResponse:
        ref = request.scaledObjectRef
        cfg = self._config(ref)
        target = cfg.target_for(request.metricName)
        if target is None:
            raise ConfigError(f"metricName: {request.metricName[:100]!r} is not one of "
                              f"{', '.join(cfg.metric_name(t) for t in cfg.targets)}")
        value = self._value(ref, cfg, target)
        return pb.GetMetricsResponse(metricValues=[pb.MetricValue(
            metricName=request.metricName, metricValue=round(value),
            metricValueFloat=value)])

    # -- the contract --------------------------------------------------------------------

    async def IsActive(self, request: pb.ScaledObjectRef,
                       context: Context) -> pb.IsActiveResponse:
        try:
            return pb.IsActiveResponse(result=self._active(request, self._config(request)))
        except GpuscaleError as exc:
            await abort(context, exc, request)
            raise AssertionError("unreachable") from None
        finally:
            self._answered("IsActive", context)

    async def StreamIsActive(self, request: pb.ScaledObjectRef,
                             context: Context) -> AsyncIterator[pb.IsActiveResponse]:
        """Push the state when it changes (driven by fleet updates) and at least every
        ``resend_s``; KEDA acts on pushed ``true`` at once."""
        try:
            cfg = self._config(request)
        except GpuscaleError as exc:
            await abort(context, exc, request)
            return
        last: bool | None = None
        since = 0.0
        loop = asyncio.get_running_loop()
        while not self.stopping.is_set():
            try:
                active: bool | None = self._active(request, cfg)
            except WorkloadUnavailable:
                active = None  # unknown: push nothing rather than a guess
            now = loop.time()
            if active is not None and (active != last or now - since >= self._resend_s):
                yield pb.IsActiveResponse(result=active)
                last, since = active, now
            stop = asyncio.ensure_future(self.stopping.wait())
            change = asyncio.ensure_future(self.fleet.wait_changed(self._resend_s))
            _, pending = await asyncio.wait({stop, change},
                                            return_when=asyncio.FIRST_COMPLETED)
            for task in pending:
                task.cancel()

    async def GetMetricSpec(self, request: pb.ScaledObjectRef,
                            context: Context) -> pb.GetMetricSpecResponse:
        try:
            return self._spec(self._config(request))
        except GpuscaleError as exc:
            await abort(context, exc, request)
            raise AssertionError("unreachable") from None
        finally:
            self._answered("GetMetricSpec", context)

    async def StreamMetricSpec(self, request: pb.ScaledObjectRef,
                               context: Context) -> AsyncIterator[pb.GetMetricSpecResponse]:
        """The spec now; it depends only on the metadata, so the stream then stays open
        (nothing to re-send) until the scaler shuts down."""
        try:
            spec = self._spec(self._config(request))
        except GpuscaleError as exc:
            await abort(context, exc, request)
            return
        yield spec
        await self.stopping.wait()

    async def GetMetrics(self, request: pb.GetMetricsRequest,
                         context: Context) -> pb.GetMetricsResponse:
        try:
            return self._metrics(request)
        except GpuscaleError as exc:
            await abort(context, exc, request.scaledObjectRef)
            raise AssertionError("unreachable") from None
        finally:
            self._answered("GetMetrics", context)


async def abort(context: Context, exc: GpuscaleError, ref: pb.ScaledObjectRef) -> None:
    """The one place a gpuscale error becomes a gRPC status (common.errors says which):
    INVALID_ARGUMENT for input that cannot be used, UNAVAILABLE for missing data (KEDA then
    applies its fallback). Unavailable answers name the ScaledObject."""
    message = str(exc)
    if isinstance(exc, DataUnavailable):
        message = f"{ref.namespace}/{ref.name}: {message}"
    await context.abort(grpc.StatusCode[exc.grpc_code], message)


class ScalerServer:
    """The gRPC server: ExternalScaler, health checking and reflection, one port."""

    def __init__(self, service: ScalerService, host: str = "[::]",
                 port: int = DEFAULT_PORT,
                 credentials: grpc.ServerCredentials | None = None) -> None:
        self.service = service
        self.health = HealthServicer()
        self._server = grpc.aio.server(options=[
            ("grpc.max_receive_message_length", 1024 * 1024),
            ("grpc.max_concurrent_streams", 1000)])
        pb_grpc.add_ExternalScalerServicer_to_server(service, self._server)  # type: ignore[no-untyped-call]
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        reflection.enable_server_reflection(
            (SERVICE, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
             reflection.SERVICE_NAME), self._server)
        address = host if host.startswith("unix:") else f"{host}:{port}"
        self.port = bind(self._server, address, credentials)

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
        await self.start()
        if on_listening is not None:
            on_listening(self.port)
        try:
            await self._server.wait_for_termination()
        finally:
            await asyncio.shield(self.stop())
