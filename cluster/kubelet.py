"""The kubelet's PodResources API for each simulated node, fed from the real API's pods.

Which device a pod holds is the device plugin's choice on a real node; here the first
free IDs of the node's inventory (``nodes.devices``) go to each container's extended
resource limits, in the order the pods are first seen, and come back when the pod is gone
or finished. The server is the suite's kubelet peer (tests/peers/kubelet.py), which keeps
the real kubelet's quirks (finished pods listed, devices freed late)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from cluster.dra import Claimed, ClaimIndex, container_claims
from gpuscale.proto import podresources_v1_pb2 as pb
from tests.peers.kubelet import KubeletPeer, claim

Assignment = dict[str, dict[str, list[str]]]  # container -> resource -> device IDs


def _limits(container: Mapping[str, Any]) -> dict[str, int]:
    res = container.get("resources") or {}
    limits = {**(res.get("requests") or {}), **(res.get("limits") or {})}
    out: dict[str, int] = {}
    for name, value in limits.items():
        try:
            out[str(name)] = int(str(value))
        except ValueError:
            continue  # cpu "500m", memory "1Gi": not devices
    return out


class NodeDevices:
    """One node's inventory and who holds what."""

    def __init__(self, node: str, inventory: Mapping[str, list[str]], socket: Path) -> None:
        self.node = node
        self.inventory = {r: list(ids) for r, ids in inventory.items()}
        self.held: dict[str, tuple[str, str, Assignment]] = {}  # uid -> (ns, name, devices)
        self.claims: dict[str, dict[str, list[Claimed]]] = {}  # uid -> container -> claims
        self.peer = KubeletPeer(socket)

    def _free(self, resource: str) -> list[str]:
        taken = {d for _, _, a in self.held.values() for c in a.values()
                 for d in c.get(resource, [])}
        return [d for d in self.inventory.get(resource, []) if d not in taken]

    def sync(self, pods: Iterable[Mapping[str, Any]], claims: ClaimIndex | None = None) -> None:
        """Assign devices to the node's new pods, free those of pods gone or finished;
        list the DRA claims (``claims``: the API's, by namespace and name) pods name."""
        live: set[str] = set()
        for p in pods:
            meta, status = p.get("metadata") or {}, p.get("status") or {}
            uid = str(meta.get("uid", ""))
            if not uid or status.get("phase") in ("Succeeded", "Failed"):
                continue
            if uid not in self.held:
                dra = container_claims(p, claims or {})
                if dra is None:
                    continue  # a claim not allocated yet: the pod is not started
                self.claims[uid] = dra
                self.held[uid] = (str(meta.get("namespace")), str(meta.get("name")),
                                  self._assign(p))
            live.add(uid)
        for uid in set(self.held) - live:
            del self.held[uid]
            self.claims.pop(uid, None)
        self._publish()

    def _assign(self, pod: Mapping[str, Any]) -> Assignment:
        out: Assignment = {}
        for c in (pod.get("spec") or {}).get("containers") or []:
            for resource, count in _limits(c).items():
                if resource not in self.inventory or count <= 0:
                    continue
                ids = self._free(resource)[:count]
                out.setdefault(str(c.get("name")), {})[resource] = ids
        return out

    def _publish(self) -> None:
        self.peer.pods = [self._listed(uid) for uid in self.held]
        self.peer.allocatable = [pb.ContainerDevices(resource_name=r, device_ids=ids)
                                 for r, ids in self.inventory.items()]

    def _listed(self, uid: str) -> pb.PodResources:
        ns, name, assignment = self.held[uid]
        dra = self.claims.get(uid, {})
        return pb.PodResources(namespace=ns, name=name, containers=[
            pb.ContainerResources(
                name=c,
                devices=[pb.ContainerDevices(resource_name=r, device_ids=ids)
                         for r, ids in assignment.get(c, {}).items()],
                dynamic_resources=[claim(k.name, *k.devices, namespace=k.namespace)
                                   for k in dra.get(c, [])])
            for c in [*assignment, *(c for c in dra if c not in assignment)]])

    def holds(self, uid: str) -> Assignment:
        return self.held.get(uid, ("", "", {}))[2]
