"""The read-only operator service (inspect.proto): the fleet now, one ScaledObject
explained, per-minute device use. Served on the KEDA port with the same credentials, so it
is exactly as protected as the scaler's answers; it reads the scaler's memory and changes
nothing KEDA gets (planners are read, never asked: reading does not keep one alive).

``record`` runs beside the service: every STEP_S it writes what the scaler would answer
for each ScaledObject KEDA asks about, and samples every device, into scaler.history.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import suppress
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import grpc

from gpuscale.common.errors import ConfigError, DataUnavailable, GpuscaleError
from gpuscale.kube.replies import int_at, obj_at, str_at
from gpuscale.proto import externalscaler_pb2 as keda_pb
from gpuscale.proto import inspect_pb2 as pb
from gpuscale.proto import inspect_pb2_grpc as pb_grpc
from gpuscale.scaler.core.aggregate import WorkloadUnavailable, evaluate
from gpuscale.scaler.core.planner import Plan
from gpuscale.scaler.core.profiles import PLANNED
from gpuscale.scaler.edges.keda import ScalerService, check_ref
from gpuscale.scaler.state.history import (
    MAX_NAMED,
    MINUTE_S,
    STEP_S,
    Answer,
    DeviceHistory,
    Moment,
    Seen,
)
from gpuscale.stream.codec import put_device, put_reading
from gpuscale.stream.records import DeviceRecord, PodRecord

if TYPE_CHECKING:
    from gpuscale.scaler.sources.workloads import WorkloadResolver
    from gpuscale.stream.subscriber import LinkState

log = logging.getLogger(__name__)

SERVICE = "gpuscale.inspect.v1.Inspect"
DEVICE_STEP_S = 15.0  # devices sampled this often (four utilization samples a minute)
RECORD_CHUNK = 50  # ScaledObjects recorded between two turns of the event loop
MAX_FILTER = 253
FLEET_CHUNK = 500  # pods put into a Fleet reply between two turns of the event loop
USAGE_CHUNK = 1000  # devices put into a Usage reply between two turns of the event loop
FORGOTTEN_S = 600.0  # Fleet lists the ScaledObjects KEDA asked about within this

Context = grpc.aio.ServicerContext[Any, Any]
Links = Callable[[], Iterable["LinkState"]]


class Inspector(pb_grpc.InspectServicer):
    def __init__(self, service: ScalerService, links: Links | None = None,
                 workloads: WorkloadResolver | None = None,
                 wall: Callable[[], float] = time.time, step_s: float = STEP_S) -> None:
        """``links``: the subscriber's agent links (None where the fleet view is fed in
        the same process: the demo); ``workloads``: the ScaledObject watch, when the API is
        used (min/max replicas, fallback, the target's replica count)."""
        self._service = service
        self._fleet = service.fleet
        self._history = service.history
        self._links = links
        self._workloads = workloads
        self._wall = wall
        self.devices = DeviceHistory(keep_s=self._history.keep_s)
        self._history.step_s = step_s  # before any ScaledObject is noted (ring sizes)

    # -- what the scaler would answer ------------------------------------------------------

    def _moment(self, namespace: str, name: str, seen: Seen,
                plans: Mapping[tuple[str, str], Plan | str] | None = None,
                ) -> tuple[Moment, list[PodRecord]]:
        """What the scaler answers now for each target of ``seen``, without side effects
        (no planner created or kept alive), and the pods it read. ``plans``: PlanBook.peek
        now (read once per step by callers that explain many)."""
        svc, cfg = self._service, seen.config
        ref = keda_pb.ScaledObjectRef(namespace=namespace, name=name,
                                      scalerMetadata=seen.metadata)
        records: list[PodRecord] = []
        gaps: list[str] = []
        whole = ""
        try:
            records, gaps = svc.pods_of(ref, cfg)
        except GpuscaleError as exc:  # unavailable, or a trigger this scaler cannot use
            whole = str(exc)
        if plans is None:
            plans = svc.plans.peek(self._fleet.now())
        peeked = plans.get((namespace, name))
        plan = peeked if isinstance(peeked, Plan) else None
        problem = peeked if isinstance(peeked, str) else None
        answers = []
        for t in cfg.targets:
            base = Answer(cfg.metric_name(t), t.signal, t.target, t.activation)
            if whole:
                answers.append(replace(base, unavailable=whole))
            elif t.signal == PLANNED:
                if problem:
                    answers.append(replace(base, unavailable=problem))
                elif plan is None:
                    answers.append(replace(base, unavailable="the planner has no plan yet"))
                else:
                    answers.append(replace(base, value=plan.replicas * t.target,
                                            counted=len(records)))
            else:
                try:
                    ev = evaluate(self._fleet, records, t, cfg.value_mode, gaps)
                    answers.append(replace(base, value=ev.value, counted=ev.pods,
                                            starting=ev.starting, ready=ev.ready))
                except WorkloadUnavailable as exc:
                    answers.append(replace(base, unavailable=str(exc)))
        demand = ""
        if cfg.demand_source and svc.demand is not None:
            try:
                demand = "pending" if svc.demand(cfg.demand_source) else "none"
            except (DataUnavailable, ConfigError) as exc:
                demand = f"cannot tell: {exc}"
        terms = tuple(plan.terms().items()) if plan is not None else ()
        moment = Moment(self._wall(), tuple(answers), len(records),
                        plan.replicas if plan is not None else -1, terms,
                        tuple(gaps[:MAX_NAMED]), demand)
        return moment, records

    def live_devices(self) -> dict[str, tuple[DeviceRecord, ...]]:
        """The devices of nodes heard from within the staleness bound, by node name (the
        agent's identity where the links know it, else its address). A silent or departed
        agent's last readings are not data: its minutes stay absent rather than repeat."""
        ages = self._fleet.nodes()
        names = {s.address: s.identity for s in self._links()} if self._links else {}
        return {names.get(node) or node: devs for node, devs in self._fleet.devices().items()
                if ages.get(node, math.inf) <= self._fleet.stale_after}

    async def record(self, chunk: int = RECORD_CHUNK) -> None:
        """Every step (STEP_S unless the constructor says) a moment per ScaledObject KEDA
        asked about within the kept history; every DEVICE_STEP_S (or the step, if
        shorter) a sample of every device. Runs until cancelled."""
        period = min(self._history.step_s, DEVICE_STEP_S)  # devices at least this often
        last_moments = -math.inf
        while True:
            started = time.monotonic()
            try:
                self.devices.sample(self._wall(), self.live_devices(), self._fleet.pods())
                if started - last_moments >= self._history.step_s - period / 2:
                    last_moments = started
                    items = self._history.items()
                    for i in range(0, len(items), chunk):
                        self._record(items[i:i + chunk])
                        await asyncio.sleep(0)
            except Exception as exc:  # a bug here must not end the scaler
                log.error("recording the history failed: %s", exc, exc_info=exc)
            await asyncio.sleep(max(0.0, period - (time.monotonic() - started)))

    def record_now(self) -> None:
        """One step of ``record`` at once (all ScaledObjects, no yielding)."""
        self.devices.sample(self._wall(), self.live_devices(), self._fleet.pods())
        self._record(self._history.items())

    def _record(self, items: Iterable[tuple[tuple[str, str], Seen]]) -> None:
        plans = self._service.plans.peek(self._fleet.now())
        for (ns, name), seen in items:
            if self._fleet.now() - seen.asked_at <= self._history.keep_s:
                try:
                    self._history.record(ns, name, self._moment(ns, name, seen, plans)[0])
                except Exception as exc:  # one ScaledObject's bug must not stop the rest
                    log.error("recording %s/%s failed: %s", ns, name, exc, exc_info=exc)

    # -- the service -----------------------------------------------------------------------

    async def Fleet(self, request: pb.FleetRequest, context: Context) -> pb.FleetReply:
        await _check_filter(context, "namespace", request.namespace)
        await _check_filter(context, "node", request.node)
        ns, node = request.namespace, request.node
        reply = pb.FleetReply(now=self._wall(), stale_after=self._fleet.stale_after)
        devices = self._fleet.devices()
        ages = self._fleet.nodes()
        if self._links is not None:
            for s in self._links():
                if node and node not in (s.identity, s.address):
                    continue
                n = reply.nodes.add(name=s.identity or s.address, address=s.address,
                                    connected=s.connected,
                                    age=ages.get(s.address, -1.0),
                                    problem=s.waiting() or s.error)
                for d in devices.get(s.address, ()):
                    put_device(n.devices.add(), d)
        else:
            for address, devs in devices.items():
                if node and address != node:
                    continue
                n = reply.nodes.add(name=address, address=address, connected=True,
                                    age=ages.get(address, -1.0))
                for d in devs:
                    put_device(n.devices.add(), d)
        gpus = self._gpus()
        # Built in chunks with a turn of the event loop between them: a whole fleet
        # (8,000 pods) takes ~170 ms, which KEDA's calls must not wait for in one piece.
        for i, p in enumerate(self._fleet.pods()):
            if (not ns or p.namespace == ns) and (not node or p.node == node):
                self._put_pod(reply.pods.add(), p, gpus)
            if i % FLEET_CHUNK == FLEET_CHUNK - 1:
                await asyncio.sleep(0)
        plans = self._service.plans.peek(self._fleet.now())
        for i, ((sns, name), seen) in enumerate(self._history.items()):
            if (ns and sns != ns) or self._fleet.now() - seen.asked_at > FORGOTTEN_S:
                continue  # not asked about for a while: deleted, or another scaler's
            if i % RECORD_CHUNK == RECORD_CHUNK - 1:
                await asyncio.sleep(0)
            moment, _ = self._moment(sns, name, seen, plans)
            w = reply.workloads.add(namespace=sns, name=name,
                                    seen=self._fleet.now() - seen.asked_at,
                                    pods=moment.pods, planned_replicas=moment.planned)
            _put_answers(w.answers, moment.answers)
        return reply

    async def Explain(self, request: pb.ExplainRequest, context: Context) -> pb.ExplainReply:
        try:
            check_ref(keda_pb.ScaledObjectRef(namespace=request.namespace,
                                              name=request.name))
        except ConfigError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if not math.isfinite(request.at) or request.at < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"at: {request.at} is not a time (wall seconds, 0 = now)")
        ns, name = request.namespace, request.name
        seen = self._history.get(ns, name)
        if seen is None:
            name, why = self._scaled_object_of(ns, request.name)
            if not name:
                await context.abort(grpc.StatusCode.NOT_FOUND, why)
            seen = self._history.get(ns, name)
            assert seen is not None
        reply = pb.ExplainReply(now=self._wall(), namespace=ns, name=name,
                                selector=seen.config.selector.text
                                if seen.config.selector is not None else "",
                                value_mode=seen.config.value_mode.value,
                                seen=self._fleet.now() - seen.asked_at, at=request.at,
                                demand_source=seen.config.demand_source or "")
        reply.metadata.update(seen.metadata)
        if request.at:
            moment, why = self._history.at(ns, name, request.at)
            if moment is None:
                await context.abort(grpc.StatusCode.OUT_OF_RANGE, why)
            assert moment is not None
            reply.at = moment.at
        else:
            moment, records = self._moment(ns, name, seen)
            gpus = self._gpus()
            for p in records:
                self._put_pod(reply.pods.add(), p, gpus)
            if seen.config.selector is None and self._workloads is not None:
                resolved = self._workloads.resolve(ns, name)
                reply.selector = resolved if isinstance(resolved, str) else resolved.text
        _put_answers(reply.answers, moment.answers)
        reply.pod_count, reply.step = moment.pods, self._history.step_s
        if request.history > 0 and math.isfinite(request.history):
            for m in self._history.before(ns, name, moment.at,
                                          min(request.history, self._history.keep_s)):
                if m.at < moment.at:
                    past = reply.past.add(at=m.at, pods=m.pods, planned_replicas=m.planned)
                    _put_answers(past.answers, m.answers)
        reply.missing.extend(moment.missing)
        reply.plan_terms.update(dict(moment.terms))
        reply.planned_replicas = moment.planned
        reply.demand = moment.demand
        self._put_target(reply.scale_target, ns, name)
        return reply

    async def Usage(self, request: pb.UsageRequest, context: Context) -> pb.UsageReply:
        await _check_filter(context, "namespace", request.namespace)
        if not math.isfinite(request.window) or request.window < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"window: {request.window} is not a number of seconds")
        now = self._wall()
        window = min(request.window or self.devices.keep_s, self.devices.keep_s)
        reply = pb.UsageReply(now=now, minute=MINUTE_S, kept=self.devices.keep_s,
                              untracked=len(self.devices.untracked))
        prefix = f"{request.namespace}/"
        for i, (uuid, dlog, minutes) in enumerate(self.devices.logs(now - window)):
            if i % USAGE_CHUNK == USAGE_CHUNK - 1:
                await asyncio.sleep(0)  # KEDA's calls go between the chunks
            if request.namespace and not any(p.startswith(prefix)
                                             for m in minutes for p in m.pods):
                continue
            d = reply.devices.add(node=dlog.node, uuid=uuid, model=dlog.model,
                                  fraction=dlog.fraction)
            for m in minutes:
                util = m.util_sum / m.samples if m.samples else -1.0
                d.minutes.add(start=m.start, pods=m.pods, owners=m.owners, utilization=util,
                              samples=m.samples)
        return reply

    # -- helpers ---------------------------------------------------------------------------

    def _scaled_object_of(self, namespace: str, name: str) -> tuple[str, str]:
        """The ScaledObject KEDA asked about that scales workload ``name`` (a Deployment or
        StatefulSet): by the ScaledObject watch, else by the owners of the pods each one
        selects. ("", why) when none or several."""
        known = sorted(so for (ns, so), _ in self._history.items() if ns == namespace)
        found: list[str] = []
        if self._workloads is not None:
            for kind in ("Deployment", "StatefulSet"):
                found += [so for so in self._workloads.scaling(namespace, kind, name)
                          if so in known]
        else:
            for so in known:
                seen = self._history.get(namespace, so)
                assert seen is not None
                ref = keda_pb.ScaledObjectRef(namespace=namespace, name=so)
                with suppress(GpuscaleError):
                    records, _ = self._service.pods_of(ref, seen.config)
                    if any(r.owner is not None and r.owner.name == name for r in records):
                        found.append(so)
        if len(found) == 1:
            return found[0], ""
        if found:
            return "", (f"{namespace}/{name} is scaled by several ScaledObjects: "
                        f"{', '.join(found)}; name one")
        listed = ", ".join(known[:20]) or "none"
        return "", (f"no ScaledObject {namespace}/{name} (nor one scaling a workload of that "
                    f"name) has been asked about by KEDA at this scaler; known in "
                    f"{namespace}: {listed}")

    def _gpus(self) -> dict[str, list[str]]:
        """"namespace/name" -> the devices it holds, in words."""
        out: dict[str, list[str]] = {}
        for devs in self._fleet.devices().values():
            index = {d.uuid: d.index for d in devs}
            for d in devs:
                if d.parent_uuid:
                    what = f"MIG {d.model} on GPU {index.get(d.parent_uuid, d.index)}"
                elif len(d.pods) > 1 or d.sharing in ("time-sliced", "mps"):
                    what = f"GPU {d.index} {d.sharing} 1/{max(1, len(d.pods))}"
                else:
                    what = f"GPU {d.index}"
                for p in d.pods:
                    out.setdefault(p, []).append(what)
        return out

    def _put_pod(self, msg: pb.Pod, p: PodRecord,
                 gpus: Mapping[str, list[str]] | None = None) -> None:
        if gpus is not None:
            msg.gpus.extend(gpus.get(f"{p.namespace}/{p.name}", ()))
        msg.namespace, msg.name, msg.node, msg.ready = p.namespace, p.name, p.node, p.ready
        if p.owner is not None:
            msg.owner_kind, msg.owner_name = p.owner.kind, p.owner.name
        msg.age = self._fleet.age(p)
        msg.stale_after = p.stale_after or self._fleet.stale_after
        msg.labels.update(p.labels)
        for signal, value in p.signals.items():
            put_reading(msg.signals[signal], value)
            if signal in p.reasons:
                msg.signals[signal].detail = p.reasons[signal]

    def _put_target(self, msg: pb.ScaleTarget, namespace: str, name: str) -> None:
        spec = (self._workloads.scaled_object(namespace, name)
                if self._workloads is not None else None)
        msg.replicas = msg.fallback_replicas = -1
        msg.min_replicas, msg.max_replicas = 0, 100  # KEDA's defaults
        msg.fallback_failures, msg.polling_interval, msg.cooldown_period = 3, 30, 300
        if spec is None:
            return
        msg.known = True
        msg.kind = str_at(spec, "scaleTargetRef", "kind") or "Deployment"
        msg.name = str_at(spec, "scaleTargetRef", "name")
        msg.min_replicas = int_at(spec, "minReplicaCount", default=0)
        msg.max_replicas = int_at(spec, "maxReplicaCount", default=100)
        msg.polling_interval = int_at(spec, "pollingInterval", default=30)
        msg.cooldown_period = int_at(spec, "cooldownPeriod", default=300)
        if obj_at(spec, "fallback"):
            msg.fallback_replicas = int_at(spec, "fallback", "replicas", default=-1)
            msg.fallback_failures = int_at(spec, "fallback", "failureThreshold", default=3)
            msg.fallback_behavior = str_at(spec, "fallback", "behavior")[:64] or "static"
        behavior = obj_at(spec, "advanced", "horizontalPodAutoscalerConfig", "behavior")
        if behavior:
            msg.behavior_json = json.dumps(behavior, sort_keys=True)[:16384]
        assert self._workloads is not None
        count = self._workloads.replicas(namespace, msg.kind, msg.name)
        if count is not None:
            msg.replicas = count


def _put_answers(out: Any, answers: Iterable[Answer]) -> None:
    for a in answers:
        out.add(metric_name=a.metric_name, signal=a.signal, target=a.target,
                activation=a.activation, value=a.value, unavailable=a.unavailable,
                counted=a.counted, starting=a.starting, ready=a.ready)


async def _check_filter(context: Context, what: str, value: str) -> None:
    if len(value) > MAX_FILTER or any(c in value for c in "/ \t\n"):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                            f"{what}: {value[:64]!r} is not a Kubernetes name")


def add_to_server(inspector: Inspector, server: grpc.aio.Server) -> None:
    pb_grpc.add_InspectServicer_to_server(inspector, server)  # type: ignore[no-untyped-call]
