"""A test kubelet: PodResources v1 served on a real unix socket, from the API contract.

The test mutates ``pods``/``allocatable`` between calls, stops and restarts the server
(the kubelet recreates its socket on restart) and can slow answers down.

Pods that finished (``terminate``: phase Succeeded or Failed, not yet deleted) are listed as
the real kubelet lists them (kubernetes/kubernetes pkg/kubelet/apis/podresources/
server_v1.go ``List``): every pod the kubelet knows (``GetPods``), so terminal ones too -
kubernetes/kubernetes#119423 and #132020 - until 1.34 made the active pods the default
(#132028, feature gate KubeletPodResourcesListUseActivePods: ``active_pods_only``). Their
device-plugin devices are reported until the device manager frees them
(``UpdateAllocatedDevices``, called by ``List`` but a no-op until all pod sources are ready:
``sources_ready``, False just after a kubelet restart); once freed, the pod is listed with
its containers and no devices. CPUs and memory are reported regardless (not modelled).

DRA claims (``claim``, ``dra_pod``) are listed as the kubelet's ``GetDynamicResources``
(pkg/kubelet/cm/container_manager_linux.go, 1.37) lists them: in ``dynamic_resources``, one
entry per claim the container names, with *every* device of the claim (not only the
container's request); devices grouped by driver in map order (``claim`` takes the order
given: a test passes drivers in either order); the CDI list shared across one driver's
devices, so the k-th device of a driver carries the CDI ids of devices 1..k. A claim the
kubelet's cache lacks (``lost_claims``) makes it log and list the container with no dynamic
resources at all.
"""

from __future__ import annotations

import asyncio
import copy
import urllib.parse
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import grpc

from gpuscale.proto import podresources_v1_pb2 as pb
from gpuscale.proto import podresources_v1_pb2_grpc as pb_grpc

Context = grpc.aio.ServicerContext[Any, Any]


def claim(name: str, *devices: tuple[str, str, str], namespace: str = "",
          share_ids: dict[str, str] | None = None) -> pb.DynamicResource:
    """A claim's entry as the kubelet lists it: devices (driver, pool, device), grouped by
    driver in the order the drivers first appear, each driver's CDI list cumulative."""
    by_driver: dict[str, list[tuple[str, str]]] = {}
    for driver, pool, device in devices:
        by_driver.setdefault(driver, []).append((pool, device))
    resources = []
    for driver, devs in by_driver.items():
        cdi: list[pb.CDIDevice] = []  # one slice per driver, appended device by device
        for pool, device in devs:
            cdi.append(pb.CDIDevice(name=f"k8s.{driver}/claim={namespace or 'ns'}-{name}-"
                                         f"{device}"))
            res = pb.ClaimResource(cdi_devices=list(cdi), driver_name=driver,
                                   pool_name=pool, device_name=device)
            if share_ids and device in share_ids:
                res.share_id = share_ids[device]
            resources.append(res)
    return pb.DynamicResource(claim_name=name, claim_namespace=namespace,
                              claim_resources=resources)


def dra_pod(namespace: str, name: str, *containers: tuple[str, list[pb.DynamicResource]]
            ) -> pb.PodResources:
    """A pod whose containers hold DRA claims: (container, [claim(...), ...]); each claim's
    namespace is the pod's (claims live in their pod's namespace)."""
    out = []
    for c, claims in containers:
        listed = []
        for given in claims:
            dr = copy.deepcopy(given)
            dr.claim_namespace = dr.claim_namespace or namespace
            listed.append(dr)
        out.append(pb.ContainerResources(name=c, dynamic_resources=listed))
    return pb.PodResources(name=name, namespace=namespace, containers=out)


def pod(namespace: str, name: str, *containers: tuple[str, str, Iterable[str]]) -> pb.PodResources:
    """A pod with containers given as (container, resource, device ids)."""
    return pb.PodResources(name=name, namespace=namespace, containers=[
        pb.ContainerResources(name=c, devices=[pb.ContainerDevices(resource_name=r,
                                                                   device_ids=list(ids))])
        for c, r, ids in containers])


class KubeletPeer(pb_grpc.PodResourcesListerServicer):
    def __init__(self, socket_path: Path) -> None:
        self.socket_path = socket_path
        self.pods: list[pb.PodResources] = []
        self.allocatable: list[pb.ContainerDevices] = []
        self.terminated: set[tuple[str, str]] = set()  # (namespace, name) of finished pods
        self.active_pods_only = False  # 1.34+: List leaves finished pods out
        self.sources_ready = True  # False: the devices of finished pods are not freed yet
        self.lost_claims: set[tuple[str, str]] = set()  # (namespace, claim) not in its cache
        self.delay = 0.0
        self.calls = 0
        self._server: grpc.aio.Server | None = None

    def terminate(self, namespace: str, name: str) -> None:
        """The pod finished (Succeeded or Failed) but is not deleted: the kubelet keeps it."""
        self.terminated.add((namespace, name))

    def _as_listed(self, p: pb.PodResources) -> pb.PodResources | None:
        if any((d.claim_namespace, d.claim_name) in self.lost_claims
               for c in p.containers for d in c.dynamic_resources):
            p = copy.deepcopy(p)
            for c in p.containers:  # GetDynamicResources: an error lists none of them
                if any((d.claim_namespace, d.claim_name) in self.lost_claims
                       for d in c.dynamic_resources):
                    del c.dynamic_resources[:]
        if (p.namespace, p.name) not in self.terminated:
            return p
        if self.active_pods_only:
            return None
        if not self.sources_ready:
            return p  # the device manager still holds the finished pod's devices
        freed = copy.deepcopy(p)
        for c in freed.containers:
            del c.devices[:]
        return freed

    async def List(self, request: pb.ListPodResourcesRequest,
                   context: Context) -> pb.ListPodResourcesResponse:
        self.calls += 1
        if self.delay:
            await asyncio.sleep(self.delay)
        listed = [q for p in self.pods if (q := self._as_listed(p)) is not None]
        return pb.ListPodResourcesResponse(pod_resources=listed)

    async def GetAllocatableResources(
            self, request: pb.AllocatableResourcesRequest,
            context: Context) -> pb.AllocatableResourcesResponse:
        return pb.AllocatableResourcesResponse(devices=self.allocatable)

    async def Get(self, request: pb.GetPodResourcesRequest,
                  context: Context) -> pb.GetPodResourcesResponse:
        for p in self.pods:
            if (p.namespace, p.name) == (request.pod_namespace, request.pod_name):
                return pb.GetPodResourcesResponse(pod_resources=p)
        await context.abort(grpc.StatusCode.NOT_FOUND, "pod not found")
        raise AssertionError("unreachable")

    async def start(self) -> None:
        self.socket_path.unlink(missing_ok=True)
        self._server = grpc.aio.server()
        pb_grpc.add_PodResourcesListerServicer_to_server(self, self._server)
        self._server.add_insecure_port("unix://" + urllib.parse.quote(str(self.socket_path)))
        await self._server.start()

    async def stop(self) -> None:
        """Stop like a kubelet restart: the server goes and the socket file with it."""
        if self._server is not None:
            await self._server.stop(grace=None)
            self._server = None
        self.socket_path.unlink(missing_ok=True)
