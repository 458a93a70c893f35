"""kubelet PodResources v1 client over its unix socket.

``grpc.RpcError`` never leaves this module: failures raise ``KubeletError`` with a reason a
person can act on (socket missing, permission denied, timed out, ...). Device IDs that are
in none of the device plugin's forms are kept unmatched and reported, not guessed at. A DRA
claim's devices come as (driver, pool, device) references: ResourceSlices name them
(attribution/dra.py).
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import grpc

from gpuscale.attribution.devices import (
    VENDOR_PREFIXES,
    DeviceIdError,
    is_gpu_resource,
    parse_device_id,
)
from gpuscale.attribution.dra import MAX_DEVICE_NAME, MAX_DRIVER, MAX_POOL, dra_ref
from gpuscale.attribution.model import Allocation, DeviceKind, DeviceRef
from gpuscale.common.errors import PeerError
from gpuscale.proto import podresources_v1_pb2 as pb
from gpuscale.proto import podresources_v1_pb2_grpc as pb_grpc

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # the kubelet's own limit is the same order
DEFAULT_TIMEOUT_S = 2.0


class KubeletError(PeerError):
    """The kubelet could not be asked; the message says why."""


@dataclass(frozen=True, slots=True)
class PodResourcesList:
    allocations: tuple[Allocation, ...]
    problems: tuple[str, ...]  # malformed IDs, unattributable DRA devices, ...


class PodResourcesClient:
    """Asks the kubelet which pod containers hold which GPU devices."""

    def __init__(self, socket_path: Path = DEFAULT_SOCKET,
                 extra_resources: tuple[str, ...] = (),
                 timeout: float = DEFAULT_TIMEOUT_S,
                 dra_ignore: tuple[str, ...] = ()) -> None:
        """``dra_ignore``: DRA drivers whose devices are not GPUs (a NIC's): their claims'
        devices are left out; every other DRA device must be named by a ResourceSlice."""
        if "," in str(socket_path):  # gRPC reads "unix:a,b" as two addresses
            raise ValueError(f"kubelet socket path may not contain ',': {socket_path}")
        self.socket_path = socket_path
        self._extra = extra_resources
        self._dra_ignore = frozenset(dra_ignore)
        self._timeout = timeout
        self._channel: grpc.aio.Channel | None = None
        self._stub: pb_grpc.PodResourcesListerStub | None = None

    def _connect(self) -> pb_grpc.PodResourcesListerStub:
        if self._stub is None:
            # gRPC parses the target as a URI: escape what the path may contain (spaces, '%').
            # A channel of its own subchannels: with gRPC's process-wide pool, the channel
            # made after a kubelet restart could reuse the old server's dead connection,
            # and its first List failed ("Stream removed ... Broken pipe") - a PARTIAL tick
            # after every restart.
            self._channel = grpc.aio.insecure_channel(
                "unix://" + urllib.parse.quote(str(self.socket_path.absolute())),
                options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                         ("grpc.enable_retries", 0), ("grpc.use_local_subchannel_pool", 1)])
            self._stub = pb_grpc.PodResourcesListerStub(self._channel)  # type: ignore[no-untyped-call]
        return self._stub

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
        self._channel = self._stub = None

    async def list(self) -> PodResourcesList:
        """All GPU allocations on this node. Raises KubeletError."""
        if not self.socket_path.exists():
            await self.close()
            raise KubeletError(f"socket {self.socket_path} does not exist (is the "
                               f"pod-resources directory mounted?)")
        try:
            resp = await self._connect().List(pb.ListPodResourcesRequest(),
                                              timeout=self._timeout)
        except grpc.aio.AioRpcError as exc:
            await self.close()  # the kubelet may have restarted: dial afresh next time
            raise KubeletError(_describe(exc, self.socket_path)) from exc
        return self._parse(resp)

    async def allocatable(self) -> tuple[DeviceRef, ...]:
        """GPU devices the kubelet can allocate on this node. Raises KubeletError."""
        try:
            resp = await self._connect().GetAllocatableResources(
                pb.AllocatableResourcesRequest(), timeout=self._timeout)
        except grpc.aio.AioRpcError as exc:
            await self.close()
            raise KubeletError(_describe(exc, self.socket_path)) from exc
        refs = []
        for dev in resp.devices:
            if is_gpu_resource(dev.resource_name, self._extra):
                for raw in dev.device_ids:
                    try:
                        refs.append(parse_device_id(raw))
                    except DeviceIdError:
                        continue
        return tuple(refs)

    def _parse(self, resp: pb.ListPodResourcesResponse) -> PodResourcesList:
        allocations: list[Allocation] = []
        problems: list[str] = []
        for pod in resp.pod_resources:
            for c in pod.containers:
                for dev in c.devices:
                    if not is_gpu_resource(dev.resource_name, self._extra):
                        if dev.resource_name.startswith(VENDOR_PREFIXES):
                            problems.append(f"{pod.namespace}/{pod.name}: unrecognised "
                                            f"resource {dev.resource_name[:80]!r} ignored")
                        continue
                    refs = []
                    for raw in dev.device_ids:
                        try:
                            refs.append(parse_device_id(raw))
                        except DeviceIdError as exc:
                            # Kept, unmatched: the pod holds a GPU we cannot read, so its
                            # sums are unknown, never those of its other devices alone.
                            refs.append(DeviceRef(raw[:256], DeviceKind.UNKNOWN, ""))
                            problems.append(f"{pod.namespace}/{pod.name}/{c.name}: {exc}")
                    allocations.append(Allocation(pod.namespace, pod.name, c.name,
                                                  dev.resource_name, tuple(refs)))
                for dra in c.dynamic_resources:
                    got = _claim(pod.namespace, dra, self._dra_ignore, problems)
                    if got:
                        allocations.append(Allocation(pod.namespace, pod.name, c.name,
                                                      f"dra:{dra.claim_name[:253]}", got))
        return PodResourcesList(tuple(allocations), tuple(problems))


def _claim(namespace: str, dra: pb.DynamicResource, ignore: frozenset[str],
           problems: list[str]) -> tuple[DeviceRef, ...]:
    """A claim's devices as DRA references (named later from the node's slices);
    those of the drivers declared not to hold GPUs left out."""
    ns = dra.claim_namespace or namespace
    refs = []
    for res in dra.claim_resources:
        if res.driver_name in ignore:
            continue
        if not res.device_name:  # the API reserves this for non-device resources
            problems.append(f"claim {ns[:63]}/{dra.claim_name[:80]}: a resource of "
                            f"{res.driver_name[:63]!r} with no device name ignored")
            continue
        if (len(res.driver_name) > MAX_DRIVER or len(res.pool_name) > MAX_POOL
                or len(res.device_name) > MAX_DEVICE_NAME or not res.pool_name):
            ref = DeviceRef(f"claim {ns[:63]}/{dra.claim_name[:80]}: a device the "
                            f"kubelet names beyond the API's bounds", DeviceKind.UNKNOWN,
                            "", claim=f"{ns[:63]}/{dra.claim_name[:253]}")
            problems.append(ref.raw)
            refs.append(ref)
            continue
        refs.append(dra_ref(ns, dra.claim_name[:253], res.driver_name, res.pool_name,
                            res.device_name))
    return tuple(refs)


def _describe(exc: grpc.aio.AioRpcError, path: Path) -> str:
    code = exc.code()
    full = exc.details() or ""
    details = full[:200]
    if code is grpc.StatusCode.UNAVAILABLE and "ermission denied" in full:
        return f"permission denied on {path} (run as root or grant access to the socket)"
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"kubelet did not answer on {path} in time"
    if code is grpc.StatusCode.UNIMPLEMENTED:
        return "kubelet does not serve PodResources v1 (Kubernetes < 1.20?)"
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        return f"kubelet answer larger than {MAX_MESSAGE_BYTES} bytes"
    return f"kubelet {code.name.lower()}: {details}"
