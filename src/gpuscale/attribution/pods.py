"""Node pod cache: the pods on this node, kept current by a list+watch (kube.listwatch),
with each pod's owner followed up to its workload."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from gpuscale.attribution.model import OwnerRef, PodInfo, PodPhase
from gpuscale.kube.api import Collection, KubeApi, ObjectRef
from gpuscale.kube.errors import ApiError
from gpuscale.kube.listwatch import BACKOFF_S, INACTIVITY_S
from gpuscale.kube.replies import list_at, obj_at, str_at
from gpuscale.telemetry.model import Absent

MAX_LABELS = 64  # per pod, bounded label cardinality downstream
MAX_PODS = 10_000


def pod_info(raw: Mapping[str, Any], owner: OwnerRef | None = None) -> PodInfo:
    """A PodInfo from a pod as the API returns it (JSON); a field of the wrong JSON type
    reads as absent. ``owner`` overrides the direct controller (the cache resolves
    ReplicaSet -> Deployment and Job -> CronJob)."""
    meta = obj_at(raw, "metadata")
    status = obj_at(raw, "status")
    if owner is None:
        owner = direct_owner(meta)
    ready = any(str_at(c, "type") == "Ready" and str_at(c, "status") == "True"
                for c in list_at(status, "conditions"))
    ids = []
    for cs in list_at(status, "containerStatuses") + list_at(status, "initContainerStatuses"):
        cid = str_at(cs, "containerID")
        if cid:
            ids.append((str_at(cs, "name"), cid.split("://", 1)[-1]))
    phases = {p.value: p for p in PodPhase}
    return PodInfo(
        namespace=str_at(meta, "namespace"), name=str_at(meta, "name"),
        uid=str_at(meta, "uid"),
        labels=tuple(sorted((str(k), str(v)) for k, v in obj_at(meta, "labels").items()))
        [:MAX_LABELS],
        annotations=tuple(sorted((str(k), str(v)[:1024])
                                 for k, v in obj_at(meta, "annotations").items()
                                 if str(k).startswith("gpuscale.io/"))),
        owner=owner, phase=phases.get(str_at(status, "phase"), PodPhase.UNKNOWN),
        ready=ready, ip=str_at(status, "podIP"), container_ids=tuple(ids))


def direct_owner(meta: Mapping[str, Any]) -> OwnerRef | None:
    for ref in list_at(meta, "ownerReferences"):
        if isinstance(ref, Mapping) and ref.get("controller"):
            return OwnerRef(str_at(ref, "kind"), str_at(ref, "name"))
    return None


class NodePodCache:
    """Pods on ``node``, kept current by a watch. ``pods()`` never blocks or does I/O."""

    def __init__(self, api: KubeApi, node: str,
                 monotonic: Callable[[], float] = time.monotonic,
                 inactivity_s: float = INACTIVITY_S,
                 backoff_s: tuple[float, ...] = BACKOFF_S) -> None:
        self._api = api
        self._node = node
        self._pods: dict[tuple[str, str], PodInfo] = {}
        self._owners: dict[tuple[str, str, str], OwnerRef | None] = {}  # (ns, kind, name)
        self._lw = api.list_watch(Collection("v1", "pods",
                                             field_selector=f"spec.nodeName={node}"),
                                  f"pod watch on node {node}", on_change=self._rebuild,
                                  monotonic=monotonic, inactivity_s=inactivity_s,
                                  backoff_s=backoff_s, max_items=MAX_PODS)

    @property
    def relists(self) -> int:
        return self._lw.relists

    @property
    def resource_version(self) -> str:
        """The watch's resume point (ListWatch.resource_version)."""
        return self._lw.resource_version

    def pods(self) -> Mapping[tuple[str, str], PodInfo] | Absent:
        """(namespace, name) -> PodInfo, or UNAVAILABLE before the first successful list."""
        return Absent.UNAVAILABLE if self._lw.synced_at is None else self._pods

    def state(self) -> tuple[bool, str]:
        return self._lw.state()

    async def run(self, ready: Callable[[], None] | None = None) -> None:
        await self._lw.run(ready)

    async def _rebuild(self) -> None:
        pods = {}
        for raw in self._lw.items.values():
            meta = obj_at(raw, "metadata")
            info = pod_info(raw, await self._workload(str_at(meta, "namespace"),
                                                      direct_owner(meta)))
            pods[(info.namespace, info.name)] = info
        self._pods = pods

    async def _workload(self, ns: str, owner: OwnerRef | None) -> OwnerRef | None:
        """Follow ReplicaSet -> Deployment and Job -> CronJob (cached; one GET each)."""
        if owner is None or owner.kind not in ("ReplicaSet", "Job"):
            return owner
        key = (ns, owner.kind, owner.name)
        if key not in self._owners:
            ref = (ObjectRef("apps/v1", "replicasets", ns, owner.name)
                   if owner.kind == "ReplicaSet" else ObjectRef("batch/v1", "jobs", ns,
                                                                owner.name))
            try:
                self._owners[key] = direct_owner(obj_at(await self._api.get(ref),
                                                        "metadata")) or owner
            except ApiError as exc:
                if exc.status != 404:
                    raise
                self._owners[key] = owner  # gone: the pod's own owner is all there is
        return self._owners[key]
