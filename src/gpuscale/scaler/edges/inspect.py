"""The read-only operator service (inspect.proto): the fleet now, one ScaledObject
explained, per-minute device use. Served on the KEDA port with the same credentials, so it
is exactly as protected as the scaler's answers; it reads the scaler's memory and changes
nothing KEDA gets. Its answers come from the recorder (scaler.recorder), which asks the
one answer function read-only: no planner created, none kept alive.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from collections.abc import Iterable, Mapping
from contextlib import suppress
from typing import TYPE_CHECKING, Any

import grpc

from gpuscale.common.errors import ConfigError, GpuscaleError, Unavailable
from gpuscale.common.freshness import bound_of
from gpuscale.common.grpc_abort import forgets_request
from gpuscale.models.keda import scaled_object_spec
from gpuscale.proto import inspect_pb2 as pb
from gpuscale.proto import inspect_pb2_grpc as pb_grpc
from gpuscale.scaler.advisory import Advisor
from gpuscale.scaler.answers import Workload
from gpuscale.scaler.core.trigger import check_object_name
from gpuscale.scaler.recorder import Recorder
from gpuscale.scaler.state.history import MINUTE_S, TargetAnswer
from gpuscale.stream.codec import put_device, put_reading
from gpuscale.stream.records import PodRecord

if TYPE_CHECKING:
    from gpuscale.scaler.sources.workloads import WorkloadResolver

log = logging.getLogger(__name__)

SERVICE = "gpuscale.inspect.v1.Inspect"
RECORD_CHUNK = 50  # ScaledObjects answered between two turns of the event loop
MAX_FILTER = 253
FLEET_CHUNK = 500  # pods put into a Fleet reply between two turns of the event loop
FLEET_NODE_CHUNK = 50  # nodes' devices (decoded when read) put in a reply between turns
_AMD_PARTITION = re.compile(r"(?:spx|dpx|tpx|qpx|cpx)\b")  # an AMD partition's profile
USAGE_CHUNK = 1000  # devices put into a Usage reply between two turns of the event loop
FORGOTTEN_S = 600.0  # Fleet lists the ScaledObjects KEDA asked about within this

Context = grpc.aio.ServicerContext[Any, Any]


class Inspector(pb_grpc.InspectServicer):
    def __init__(self, recorder: Recorder, workloads: WorkloadResolver | None = None,
                 advisor: Advisor | None = None) -> None:
        """``workloads``: the ScaledObject watch, when the API is used (min/max replicas,
        fallback, the target's replica count). ``advisor``: the advisory plans, for Usage."""
        self.recorder = recorder
        self._advisor = advisor
        self._fleet = recorder.answers.fleet
        self._history = recorder.history
        self._links = recorder.links
        self._workloads = workloads
        self._wall = recorder.wall

    # -- the service -----------------------------------------------------------------------

    @forgets_request  # a refused call keeps nothing of its request
    async def Fleet(self, request: pb.FleetRequest, context: Context) -> pb.FleetReply:
        await _check_filter(context, "namespace", request.namespace)
        await _check_filter(context, "node", request.node)
        ns, node = request.namespace, request.node
        reply = pb.FleetReply(now=self._wall(), stale_after=self._fleet.stale_after)
        devices = self._fleet.devices()
        ages, bounds = self._fleet.nodes(), self._fleet.bounds()
        if self._links is not None:
            for i, s in enumerate(self._links()):
                if node and node not in (s.identity, s.address):
                    continue
                n = reply.nodes.add(name=s.identity or s.address, address=s.address,
                                    connected=s.connected,
                                    age=ages.get(s.address, -1.0),
                                    stale_after=bounds.get(s.address, 0.0),
                                    problem=s.waiting() or s.error)
                for d in devices.get(s.address, ()):
                    put_device(n.devices.add(), d)
                if i % FLEET_NODE_CHUNK == FLEET_NODE_CHUNK - 1:
                    await asyncio.sleep(0)
        else:
            for i, (address, devs) in enumerate(devices.items()):
                if node and address != node:
                    continue
                n = reply.nodes.add(name=address, address=address, connected=True,
                                    age=ages.get(address, -1.0),
                                    stale_after=bounds.get(address, 0.0))
                for d in devs:
                    put_device(n.devices.add(), d)
                if i % FLEET_NODE_CHUNK == FLEET_NODE_CHUNK - 1:
                    await asyncio.sleep(0)
        gpus = self._gpus()
        # Built in chunks with a turn of the event loop between them: a whole fleet
        # (8,000 pods) takes ~170 ms, which KEDA's calls must not wait for in one piece.
        for i, p in enumerate(self._fleet.pods()):
            if (not ns or p.namespace == ns) and (not node or p.node == node):
                self._put_pod(reply.pods.add(), p, gpus)
            if i % FLEET_CHUNK == FLEET_CHUNK - 1:
                await asyncio.sleep(0)
        for i, ((sns, name), seen) in enumerate(self._history.items()):
            if (ns and sns != ns) or self._fleet.now() - seen.asked_at > FORGOTTEN_S:
                continue  # not asked about for a while: deleted, or another scaler's
            if i % RECORD_CHUNK == RECORD_CHUNK - 1:
                await asyncio.sleep(0)
            moment, _ = self.recorder.moment(sns, name, seen)
            w = reply.workloads.add(namespace=sns, name=name,
                                    seen=self._fleet.now() - seen.asked_at,
                                    pods=moment.pods, planned_replicas=moment.planned)
            _put_answers(w.answers, moment.answers)
        return reply

    @forgets_request
    async def Explain(self, request: pb.ExplainRequest, context: Context) -> pb.ExplainReply:
        try:
            check_object_name(request.namespace, request.name)
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
        chosen = seen.selector or seen.config.selector  # the asker's resolved, or its own
        reply = pb.ExplainReply(now=self._wall(), namespace=ns, name=name,
                                selector=chosen.text if chosen is not None else "",
                                value_mode=seen.config.value_mode.value,
                                seen=self._fleet.now() - seen.asked_at, at=request.at,
                                demand_source=seen.config.demand_source or "",
                                source=seen.source)
        reply.metadata.update(seen.metadata)
        if request.at:
            moment, why = self._history.at(ns, name, request.at)
            if moment is None:
                await context.abort(grpc.StatusCode.OUT_OF_RANGE, why)
            assert moment is not None
            reply.at = moment.at
        else:
            moment, selection = self.recorder.moment(ns, name, seen)
            gpus = self._gpus()
            for p in selection.pods if selection is not None else ():
                self._put_pod(reply.pods.add(), p, gpus)
            if chosen is None and self._workloads is not None:
                resolved = self._workloads.resolve(ns, name)
                reply.selector = (resolved.reason if isinstance(resolved, Unavailable)
                                  else resolved.text)
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
        reply.activity = ("active" if moment.active else "inactive"
                          if moment.active is not None else
                          "unavailable" if moment.inactive_unknown else "")
        reply.activity_reason = moment.inactive_unknown
        self._put_target(reply.scale_target, ns, name)
        return reply

    @forgets_request
    async def Usage(self, request: pb.UsageRequest, context: Context) -> pb.UsageReply:
        await _check_filter(context, "namespace", request.namespace)
        if not math.isfinite(request.window) or request.window < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"window: {request.window} is not a number of seconds")
        now = self._wall()
        window = min(request.window or self.recorder.devices.keep_s, self.recorder.devices.keep_s)
        reply = pb.UsageReply(now=now, minute=MINUTE_S, kept=self.recorder.devices.keep_s,
                              untracked=len(self.recorder.devices.untracked))
        prefix = f"{request.namespace}/"
        for i, (uuid, dlog, minutes) in enumerate(self.recorder.devices.logs(now - window)):
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
        for (namespace, name), ledger in (self._advisor.state().items()
                                          if self._advisor is not None else ()):
            if request.namespace and namespace != request.namespace:
                continue
            known, planned, actual, unknown = ledger.totals()
            reply.advisory.add(
                namespace=namespace, name=name,
                planned=-1 if ledger.planned is None else ledger.planned,
                actual=-1 if ledger.actual is None else ledger.actual,
                planned_gpu_hours=planned, actual_gpu_hours=actual, known_seconds=known,
                unknown_seconds=unknown, why=ledger.why)
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
                with suppress(GpuscaleError):
                    got = self.recorder.answers.selection(Workload(namespace, so, seen.config))
                    if not isinstance(got, Unavailable) and any(
                            r.owner is not None and r.owner.name == name for r in got.pods):
                        found.append(so)
        if len(found) == 1:
            return found[0], ""
        if found:
            return "", (f"{namespace}/{name} is scaled by several ScaledObjects: "
                        f"{', '.join(found)}; name one")
        # No ScaledObject: a workload an HPA reads through the metrics API, noted as
        # "Kind/name" (metrics_api.answers), which no ScaledObject's name can be.
        read = [k for k in (f"Deployment/{name}", f"StatefulSet/{name}") if k in known]
        if len(read) == 1:
            return read[0], ""
        if read:
            return "", (f"{namespace}/{name} is both a Deployment and a StatefulSet that an "
                        "HPA reads through the metrics API; this scaler cannot tell which "
                        "is meant")
        listed = ", ".join(known[:20]) or "none"
        return "", (f"no ScaledObject {namespace}/{name} (nor one scaling a workload of that "
                    f"name) has been asked about by KEDA at this scaler, and no HPA has "
                    f"read a Deployment or StatefulSet of that name through its metrics "
                    f"API; known in {namespace}: {listed}")

    def _gpus(self) -> dict[str, list[str]]:
        """"namespace/name" -> the devices it holds, in words."""
        out: dict[str, list[str]] = {}
        for devs in self._fleet.devices().values():
            index = {d.uuid: d.index for d in devs}
            for d in devs:
                if d.parent_uuid:
                    kind = "partition" if _AMD_PARTITION.match(d.model) else "MIG"
                    what = f"{kind} {d.model} on GPU {index.get(d.parent_uuid, d.index)}"
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
        msg.stale_after = bound_of(p.stale_after, self._fleet.stale_after)
        msg.labels.update(p.labels)
        for signal, value in p.signals.items():
            put_reading(msg.signals[signal], value)
            if signal in p.reasons:
                msg.signals[signal].detail = p.reasons[signal]

    def _put_target(self, msg: pb.ScaleTarget, namespace: str, name: str) -> None:
        kind, _, target = name.partition("/")
        if target:  # a workload an HPA reads (metrics API): no ScaledObject, its replicas
            count = (self._workloads.replicas(namespace, kind, target)
                     if self._workloads is not None else None)
            msg.kind, msg.name, msg.replicas = kind, target, -1 if count is None else count
            return
        raw = (self._workloads.scaled_object(namespace, name)
               if self._workloads is not None else None)
        spec = scaled_object_spec(raw or {})  # KEDA's defaults when it is not known
        msg.replicas = -1
        msg.min_replicas, msg.max_replicas = spec.min_replicas, spec.max_replicas
        msg.polling_interval = round(spec.polling_s)
        msg.cooldown_period = round(spec.cooldown_s)
        msg.fallback_failures = spec.failure_threshold
        msg.fallback_replicas = -1 if spec.fallback_replicas is None else spec.fallback_replicas
        if raw is None or self._workloads is None:
            return
        msg.known = True
        msg.kind, msg.name = spec.target_kind, spec.target_name
        if spec.fallback_replicas is not None:
            msg.fallback_behavior = spec.fallback_behavior
        msg.behavior_json = spec.behavior_json
        count = self._workloads.replicas(namespace, msg.kind, msg.name)
        if count is not None:
            msg.replicas = count


def _put_answers(out: Any, answers: Iterable[TargetAnswer]) -> None:
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
