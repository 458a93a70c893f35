"""The kubelet peer's List of finished pods, read with the plain generated stub: listed with
their devices, listed without, or left out, as the kubelet version and its state say."""

from __future__ import annotations

import urllib.parse

import grpc
import pytest

from gpuscale.proto import podresources_v1_pb2 as pb
from gpuscale.proto import podresources_v1_pb2_grpc as pb_grpc
from tests.peers.kubelet import KubeletPeer, pod


@pytest.mark.parametrize(("active_pods_only", "sources_ready", "listed"), [
    (False, False, {"live": ["GPU-a::1"], "done": ["GPU-a::0"]}),
    (False, True, {"live": ["GPU-a::1"], "done": []}),
    (True, True, {"live": ["GPU-a::1"]}),
])
async def test_finished_pods_in_list(kubelet: KubeletPeer, active_pods_only: bool,
                                     sources_ready: bool, listed: dict[str, list[str]]) -> None:
    kubelet.pods = [pod("ns", "done", ("c", "nvidia.com/gpu", ["GPU-a::0"])),
                    pod("ns", "live", ("c", "nvidia.com/gpu", ["GPU-a::1"]))]
    kubelet.terminate("ns", "done")
    kubelet.active_pods_only, kubelet.sources_ready = active_pods_only, sources_ready
    target = "unix://" + urllib.parse.quote(str(kubelet.socket_path))
    async with grpc.aio.insecure_channel(target) as channel:
        got = await pb_grpc.PodResourcesListerStub(channel).List(
            pb.ListPodResourcesRequest())
    assert {p.name: [i for c in p.containers for d in c.devices for i in d.device_ids]
            for p in got.pod_resources} == listed
    assert [c.name for c in kubelet.pods[0].containers] == ["c"]  # the peer's own list kept
    assert list(kubelet.pods[0].containers[0].devices[0].device_ids) == ["GPU-a::0"]
