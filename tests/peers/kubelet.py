"""A test kubelet: PodResources v1 served on a real unix socket, from the API contract.

The test mutates ``pods``/``allocatable`` between calls, stops and restarts the server
(the kubelet recreates its socket on restart) and can slow answers down.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import grpc

from gpuscale.proto import podresources_v1_pb2 as pb
from gpuscale.proto import podresources_v1_pb2_grpc as pb_grpc

Context = grpc.aio.ServicerContext[Any, Any]


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
        self.delay = 0.0
        self.calls = 0
        self._server: grpc.aio.Server | None = None

    async def List(self, request: pb.ListPodResourcesRequest,
                   context: Context) -> pb.ListPodResourcesResponse:
        self.calls += 1
        if self.delay:
            await asyncio.sleep(self.delay)
        return pb.ListPodResourcesResponse(pod_resources=self.pods)

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
