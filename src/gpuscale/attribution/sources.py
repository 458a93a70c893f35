"""Where attribution inputs come from, behind one interface: the cluster, or a scenario.

``ClusterSources`` asks the kubelet (PodResources, polled each tick and kept for a short
grace period across kubelet restarts), the node pod cache and the node's ResourceSlices
(watched: they name DRA devices) and /proc (PID owners).
``ScenarioSources`` derives the same inputs from a simulated node's scenario, so the demo
and the tests of higher layers exercise the same rules.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from gpuscale.attribution.cgroup import PidResolver
from gpuscale.attribution.devices import parse_device_id
from gpuscale.attribution.dra import resolve
from gpuscale.attribution.kubelet import KubeletError, PodResourcesClient
from gpuscale.attribution.model import (
    Allocation,
    AttributionState,
    NodeAttribution,
    OwnerRef,
    PodInfo,
    PodPhase,
    ProcessOwner,
)
from gpuscale.attribution.rules import attribute
from gpuscale.common.errors import ConfigError
from gpuscale.telemetry.model import Absent, NodeSnapshot, SharingMode
from gpuscale.telemetry.scenario import NodeSpec, gpu_uuid, mig_uuid

if TYPE_CHECKING:  # the Kubernetes client is a heavy import: only when the watch runs
    from gpuscale.attribution.pods import NodePodCache
    from gpuscale.attribution.slices import NodeSliceCache
    from gpuscale.kube.api import KubeApi

log = logging.getLogger(__name__)

KUBELET_GRACE_S = 10.0  # serve the last good List this long while the kubelet is away


@dataclass(frozen=True, slots=True)
class AttributionInputs:
    allocations: Sequence[Allocation] | Absent
    allocated_at: float
    pods: Mapping[tuple[str, str], PodInfo] | Absent
    owners: Mapping[int, ProcessOwner | None] | Absent
    notes: tuple[str, ...]  # source problems to carry into the result's reasons


class AttributionSources(Protocol):
    async def gather(self, snapshot: NodeSnapshot) -> AttributionInputs: ...

    async def run(self) -> None:
        """Background work (watches) for as long as the agent runs."""
        ...

    async def close(self) -> None: ...

    def pod_infos(self) -> Mapping[tuple[str, str], PodInfo] | Absent:
        """This node's pods as last known (for the engine scraper); never blocks."""
        ...


async def attribute_tick(sources: AttributionSources, snapshot: NodeSnapshot,
                         ) -> NodeAttribution:
    """Gather this tick's inputs and apply the rules; source notes become reasons."""
    inputs = await sources.gather(snapshot)
    result = attribute(snapshot, inputs.allocations, inputs.pods, inputs.owners,
                       inputs.allocated_at)
    if inputs.notes:
        state = (result.state if result.state is not AttributionState.OK
                 else AttributionState.PARTIAL)
        result = replace(result, state=state, reasons=(*result.reasons, *inputs.notes))
    return result


class ClusterSources:
    def __init__(self, kubelet: PodResourcesClient, pods: NodePodCache | None,
                 pids: PidResolver, clock: Callable[[], float] = time.time,
                 pods_missing_reason: str = "no Kubernetes API configured",
                 api: KubeApi | None = None, slices: NodeSliceCache | None = None) -> None:
        self._kubelet = kubelet
        self._pods = pods
        self._slices = slices
        self._api = api
        self._pids = pids
        self._clock = clock
        self._pods_missing = pods_missing_reason
        self._last: tuple[tuple[Allocation, ...], float] | None = None
        self._kubelet_error = ""

    async def run(self) -> None:
        watches = [w.run() for w in (self._pods, self._slices) if w is not None]
        if not watches:
            await asyncio.Event().wait()  # nothing to watch; live as long as the agent
        async with asyncio.TaskGroup() as tg:
            for w in watches:
                tg.create_task(w)

    def pod_infos(self) -> Mapping[tuple[str, str], PodInfo] | Absent:
        return Absent.UNAVAILABLE if self._pods is None else self._pods.pods()

    async def close(self) -> None:
        await self._kubelet.close()
        if self._api is not None:
            await self._api.close()

    async def gather(self, snapshot: NodeSnapshot) -> AttributionInputs:
        notes: list[str] = []
        allocations: Sequence[Allocation] | Absent = Absent.UNAVAILABLE
        allocated_at = 0.0
        try:
            listed = await self._kubelet.list()
            self._last = (listed.allocations, self._clock())
            notes.extend(listed.problems[:5])
            if self._kubelet_error:
                log.info("kubelet pod resources: readable again")
            self._kubelet_error = ""
        except KubeletError as exc:
            if str(exc) != self._kubelet_error:
                log.warning("kubelet pod resources: %s", exc)
            self._kubelet_error = str(exc)
            notes.append(f"kubelet: {exc}")
        if self._last is not None and self._clock() - self._last[1] <= KUBELET_GRACE_S:
            allocations, allocated_at = self._last
            allocations = self._name_dra(allocations, notes)
        pods: Mapping[tuple[str, str], PodInfo] | Absent = Absent.UNAVAILABLE
        if self._pods is None:
            notes.append(f"pod metadata: {self._pods_missing}")
        else:
            pods = self._pods.pods()
            connected, why = self._pods.state()
            if not connected:
                notes.append(f"pod watch: {why}")
        pids = [p.pid for g in snapshot.gpus for p in g.processes]
        owners = await asyncio.to_thread(self._pids.owners, pids) if pids else {}
        if isinstance(owners, Absent):
            notes.append(self._pids.available()[1])
        return AttributionInputs(allocations, allocated_at, pods, owners, tuple(notes))

    def _name_dra(self, allocations: Sequence[Allocation],
                  notes: list[str]) -> Sequence[Allocation]:
        """DRA devices named from this node's ResourceSlices (unknown when none names
        them: the holder's numbers are then unknown, with a note naming the claim)."""
        if not any(a.resource.startswith("dra:") for a in allocations):
            return allocations
        inventory = None if self._slices is None else self._slices.inventory()
        why = self._pods_missing if self._slices is None else "ResourceSlices not listed yet"
        named, problems = resolve(allocations, inventory, f"no ResourceSlices: {why}")
        notes.extend(problems[:5])
        if self._slices is not None:
            connected, state = self._slices.state()
            if not connected:
                notes.append(f"ResourceSlice watch: {state}")
        return named


# Simulated engines listen on their own loopback IPs, each on a port chosen free where the
# caller serves them (``engine_port``); this one where nobody serves them (an unprivileged
# port: a real TGI's default, 80, would need root to bind).
SIM_ENGINE_PORT = 18080

_UID_NS = uuid.UUID("0b5c1a8e-3f6d-4e2a-9c7b-5d4e3f2a1b0c")


class ScenarioSources:
    """Allocations, pods and PID owners as the scenario describes them.

    Each process with a ``pod`` holds its GPU (``GPU-<uuid>``, or ``GPU-<uuid>::<n>`` on
    time-sliced GPUs) or its MIG instance. Pods are Running and Ready (unless the scenario
    says ``ready: False``, as the live demo does while a replica starts); their workload is the
    pod name without its last ``-<suffix>``, as a Deployment. Pod IPs are loopback addresses
    ``<ip_base>.<10+k>`` (all of 127/8 is loopback on Linux), and a pod with an ``engine``
    carries the engine opt-in annotations, so the agent's real scraper can read the
    simulated engines the demo serves there (gpuscale.engines.simulated_engines): at the
    pod's own ``port``, else one ``engine_port(ip)`` chose (``EngineSockets.claim``: free,
    so several demos run side by side), else ``SIM_ENGINE_PORT``.

    ``node`` may be a callable giving the node as it is now (``lambda: backend.node`` for a
    simulated backend that follows its scenario file): each ``gather`` and ``pod_infos``
    then rebuilds from it when it is another node, and a pod that stays keeps its IP and
    engine port.
    """

    def __init__(self, node: NodeSpec | Callable[[], NodeSpec],
                 clock: Callable[[], float] = time.time, ip_base: str = "127.1.0",
                 engine_port: Callable[[str], int] | None = None) -> None:
        self._clock = clock
        self._ip_base = ip_base
        self._engine_port = engine_port
        # A callable: the node as it is now (a simulated backend following its scenario
        # file), asked at each gather and rebuilt from when it is another node.
        self._follow = None if isinstance(node, NodeSpec) else node
        self._pods: dict[tuple[str, str], PodInfo] = {}
        self._build(node if isinstance(node, NodeSpec) else node())

    def _build(self, node: NodeSpec) -> None:
        self._node = node
        before = self._pods  # a pod that stays keeps its IP (and engine port) across builds
        taken = {info.ip for info in before.values()}
        allocs: dict[tuple[str, str, str], list[str]] = {}
        pods: dict[tuple[str, str], PodInfo] = {}
        owners: dict[int, ProcessOwner | None] = {}
        replicas: dict[int, int] = {}
        for p in node.processes:
            if p.pod is None:
                owners[p.pid] = None
                continue
            gpu = node.gpus[p.gpu]
            if p.mig is not None:
                device = mig_uuid(node.name, p.gpu, p.mig)
            elif gpu.sharing in (SharingMode.TIME_SLICED, SharingMode.MPS):
                replicas[p.gpu] = replicas.get(p.gpu, -1) + 1
                device = f"{gpu_uuid(node.name, p.gpu)}::{replicas[p.gpu]}"
            else:
                device = gpu_uuid(node.name, p.gpu)
            key = (p.pod.namespace, p.pod.name, p.pod.container)
            ids = allocs.setdefault(key, [])
            if device not in ids:
                ids.append(device)
            uid = str(uuid.uuid5(_UID_NS, f"{p.pod.namespace}/{p.pod.name}"))
            cid = uuid.uuid5(_UID_NS, f"{uid}/{p.pod.container}").hex * 2
            workload = p.pod.name.rsplit("-", 1)[0] if "-" in p.pod.name else p.pod.name
            prev = pods.get((p.pod.namespace, p.pod.name))
            containers = dict(prev.container_ids) if prev else {}
            containers[p.pod.container] = cid
            old = None if prev else before.get((p.pod.namespace, p.pod.name))
            ip = prev.ip if prev else (p.pod.ip or (old.ip if old else "")
                                       or self._free_ip(len(pods), taken))
            if old and old.ip == ip and _engine(old) == p.pod.engine:
                annotations = old.annotations  # its engine port was chosen once
            else:
                port = p.pod.port or (self._engine_port(ip) if self._engine_port
                                      and p.pod.engine and not prev else SIM_ENGINE_PORT)
                annotations = (prev.annotations if prev else ()) or (
                    (("gpuscale.io/engine", p.pod.engine),
                     ("gpuscale.io/metrics-port", str(port))) if p.pod.engine else ())
            taken.add(ip)
            pods[(p.pod.namespace, p.pod.name)] = PodInfo(
                p.pod.namespace, p.pod.name, uid, labels=(("app", workload),),
                annotations=annotations, owner=OwnerRef("Deployment", workload),
                phase=PodPhase.RUNNING, ready=p.pod.ready, ip=ip,
                container_ids=tuple(sorted(containers.items())))
            owners[p.pid] = ProcessOwner(uid, cid)
        self._pods, self._owners = pods, owners
        self._allocations = tuple(
            Allocation(ns, pod, c, _resource(node, ids), tuple(parse_device_id(i) for i in ids))
            for (ns, pod, c), ids in allocs.items())

    def _free_ip(self, k: int, taken: set[str]) -> str:
        k += 10
        while f"{self._ip_base}.{k}" in taken:
            k += 1
        return f"{self._ip_base}.{k}"

    def _current(self) -> None:
        if self._follow is not None:
            node = self._follow()
            if node is not self._node:
                self._build(node)

    async def run(self) -> None:
        await asyncio.Event().wait()

    async def close(self) -> None:
        pass

    def pod_infos(self) -> Mapping[tuple[str, str], PodInfo] | Absent:
        self._current()
        return self._pods

    async def gather(self, snapshot: NodeSnapshot) -> AttributionInputs:
        self._current()
        return AttributionInputs(self._allocations, self._clock(), self._pods, self._owners, ())


async def cluster_sources(kubelet_socket: Path, node_name: str, proc_root: Path,
                          kubeconfig: Path | None = None,
                          extra_resources: tuple[str, ...] = (),
                          dra_ignore: tuple[str, ...] = ()) -> ClusterSources:
    """Sources for a real node: in-cluster credentials when running in a pod, else the
    kubeconfig. A missing API or node name leaves pod metadata unavailable (and says so)."""
    from gpuscale.kube.connect import connect, credentials_available

    kubelet = PodResourcesClient(kubelet_socket, extra_resources, dra_ignore=dra_ignore)
    pids = PidResolver(proc_root)
    if not credentials_available(kubeconfig):
        return ClusterSources(kubelet, None, pids)  # and no heavy client import
    if not node_name:
        return ClusterSources(kubelet, None, pids, pods_missing_reason="node name unknown "
                              "(set --node-name or NODE_NAME from the downward API)")
    from gpuscale.attribution.pods import NodePodCache
    from gpuscale.attribution.slices import NodeSliceCache

    try:
        api = await connect(kubeconfig)
    except ConfigError as exc:
        return ClusterSources(kubelet, None, pids, pods_missing_reason=str(exc))
    return ClusterSources(kubelet, NodePodCache(api, node_name), pids, api=api,
                          slices=NodeSliceCache(api, node_name))


def _engine(info: PodInfo) -> str:
    return dict(info.annotations).get("gpuscale.io/engine", "")


def _resource(node: NodeSpec, ids: Iterable[str]) -> str:
    first = next(iter(ids))
    if first.startswith("MIG-"):
        for g in node.gpus:
            for i, prof in enumerate(g.mig):
                if mig_uuid(node.name, g.index, i) == first:
                    return f"nvidia.com/mig-{prof.name}"
    return "nvidia.com/gpu.shared" if "::" in first else "nvidia.com/gpu"
