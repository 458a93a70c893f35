"""DRA attribution end to end in the agent: the test kubelet lists claims in
``dynamic_resources`` (with the real kubelet's quirks), the test API server serves the
node's pods and ResourceSlices through list+watch, and ClusterSources names each device
and applies the rules - a DRA GPU is attributed exactly like a device-plugin GPU."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuscale.attribution.cgroup import PidResolver
from gpuscale.attribution.kubelet import PodResourcesClient
from gpuscale.attribution.model import NodeAttribution, PodUsage, Split
from gpuscale.attribution.pods import NodePodCache
from gpuscale.attribution.slices import NodeSliceCache
from gpuscale.attribution.sources import ClusterSources, attribute_tick
from gpuscale.cli.gpus import format_gpus
from gpuscale.telemetry.model import Absent, MigSample, NodeSnapshot, ProcessSample
from tests.attribution.test_rules import GIB, gpu, snap, uuid
from tests.peers.dra import AMD, NVIDIA, make_slice, nvidia_gpu, nvidia_mig
from tests.peers.kubeapi import RESOURCESLICES, KubeApiPeer, api_client, make_pod
from tests.peers.kubelet import KubeletPeer, claim, dra_pod, pod
from tests.support.polling import until

NODE = "node-1"
CID = {"a": "a" * 64, "b": "b" * 64}
UID = {"a": "0000000a-0000-4000-8000-00000000000a", "b": "0000000b-0000-4000-8000-00000000000b"}


def proc_tree(root: Path, pids: dict[int, tuple[str, str]]) -> Path:
    (root / "1").mkdir(parents=True)
    (root / "1" / "cgroup").write_text("0::/init.scope\n")
    for pid, (uid, cid) in pids.items():
        (root / str(pid)).mkdir()
        (root / str(pid) / "cgroup").write_text(f"0::/kubepods/pod{uid}/{cid}\n")
    return root


@dataclass
class Agent:
    sources: ClusterSources
    slices: NodeSliceCache

    async def tick(self, snapshot: NodeSnapshot) -> NodeAttribution:
        return await attribute_tick(self.sources, snapshot)


@pytest.fixture
async def agent(kubelet: KubeletPeer, kubeapi: KubeApiPeer,
                tmp_path: Path) -> AsyncIterator[Agent]:
    for name in ("a", "b"):
        kubeapi.add(make_pod("llm", f"vllm-{name}", UID[name], node=NODE,
                             containers=(("vllm", CID[name]),)))
    api = api_client(kubeapi)
    slices = NodeSliceCache(api, NODE, backoff_s=(0.05,))
    sources = ClusterSources(PodResourcesClient(kubelet.socket_path, timeout=1.0),
                             NodePodCache(api, NODE, backoff_s=(0.05,)),
                             PidResolver(proc_tree(tmp_path / "proc", {
                                 101: (UID["a"], CID["a"]), 102: (UID["b"], CID["b"])})),
                             api=api, slices=slices)
    task = asyncio.create_task(sources.run())
    await until(lambda: slices.inventory() is not None
                and not isinstance(sources.pod_infos(), Absent))
    yield Agent(sources, slices)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await sources.close()


def only(result: NodeAttribution, pod_name: str) -> PodUsage:
    (u,) = [u for u in result.pods if u.pod == pod_name]
    return u


def publish(kubeapi: KubeApiPeer, name: str, driver: str,
            devices: list[tuple[str, dict[str, str | int | bool]]], count: int = 1) -> None:
    kubeapi.add(make_slice(name, NODE, driver, NODE, devices, count=count), RESOURCESLICES)


async def test_a_dra_gpu_reads_as_the_same_gpu_on_the_device_plugin(
        agent: Agent, kubelet: KubeletPeer, kubeapi: KubeApiPeer) -> None:
    publish(kubeapi, "s-nv", NVIDIA, [nvidia_gpu(0, uuid(0)), nvidia_gpu(1, uuid(1))])
    kubeapi.add(make_slice("elsewhere", "node-2", NVIDIA, "node-2",
                           [nvidia_gpu(0, uuid(9))]), RESOURCESLICES)
    await until(lambda: len((agent.slices.inventory() or None).devices) == 2)  # type: ignore[union-attr]
    s = snap(gpu(0, util=70.0), gpu(1, util=20.0))
    kubelet.pods = [dra_pod("llm", "vllm-a", ("vllm", [
        claim("vllm-a-gpus", (NVIDIA, NODE, "gpu-0"), (NVIDIA, NODE, "gpu-1"))]))]
    result = await agent.tick(s)
    dra = only(result, "vllm-a")
    assert "<- llm/vllm-a/vllm (claim vllm-a-gpus)" in format_gpus(s, result)  # gpus shows it
    kubelet.pods = [pod("llm", "vllm-a", ("vllm", "nvidia.com/gpu", [uuid(0), uuid(1)]))]
    plugin = only(await agent.tick(s), "vllm-a")
    assert dra.utilization_percent == plugin.utilization_percent == 90.0
    assert dra.memory_used_bytes == plugin.memory_used_bytes == 20 * GIB
    assert dra.resource == "dra:vllm-a-gpus"
    assert [d.device.claim for d in dra.devices] == ["llm/vllm-a-gpus"] * 2


async def test_a_mig_dra_device_static_and_dynamic(agent: Agent, kubelet: KubeletPeer,
                                                    kubeapi: KubeApiPeer) -> None:
    mig = MigSample(uuid(7, "MIG"), uuid(0), 0, 1, 0, "1g.10gb", 3 * GIB, 10 * GIB, 40.0)
    other = MigSample(uuid(8, "MIG"), uuid(0), 1, 2, 0, "3g.40gb", 9 * GIB, 40 * GIB, 60.0)
    s = snap(gpu(0, mig_enabled=True, migs=(mig, other)))
    publish(kubeapi, "s-nv", NVIDIA, [
        nvidia_mig(0, uuid(0), "1g.10gb", 19, 4, 1, uuid=uuid(7, "MIG")),  # static MIG
        nvidia_mig(0, uuid(0), "3g.40gb", 9, 0, 4)])  # DynamicMIG: no uuid of its own
    await until(lambda: len(agent.slices.inventory().devices) == 2)  # type: ignore[union-attr]
    kubelet.pods = [
        dra_pod("llm", "vllm-a", ("vllm", [claim("small", (NVIDIA, NODE,
                                                            "gpu-0-mig-19-4-1"))])),
        dra_pod("llm", "vllm-b", ("vllm", [claim("big", (NVIDIA, NODE, "gpu-0-mig-9-0-4"))]))]
    result = await agent.tick(s)
    a, b = only(result, "vllm-a"), only(result, "vllm-b")
    assert (a.utilization_percent, a.devices[0].mig_uuid) == (40.0, uuid(7, "MIG"))
    assert (b.utilization_percent, b.devices[0].mig_profile) == (60.0, "3g.40gb")


async def test_a_shared_claim_is_split_by_each_pods_processes(
        agent: Agent, kubelet: KubeletPeer, kubeapi: KubeApiPeer) -> None:
    """One claim reserved for two pods (time-slicing or MPS): both list the same device."""
    publish(kubeapi, "s-nv", NVIDIA, [nvidia_gpu(0, uuid(0))])
    await until(lambda: len(agent.slices.inventory().devices) == 1)  # type: ignore[union-attr]
    procs = (ProcessSample(101, 4 * GIB, sm_util_percent=30.0),
             ProcessSample(102, 2 * GIB, sm_util_percent=15.0))
    shared = claim("shared-gpu", (NVIDIA, NODE, "gpu-0"))
    kubelet.pods = [dra_pod("llm", "vllm-a", ("vllm", [shared])),
                    dra_pod("llm", "vllm-b", ("vllm", [shared]))]
    result = await agent.tick(snap(gpu(0, util=45.0, processes=procs)))
    a, b = only(result, "vllm-a"), only(result, "vllm-b")
    assert (a.utilization_percent, b.utilization_percent) == (30.0, 15.0)
    assert a.devices[0].split is Split.PROCESS
    assert a.devices[0].sharers == 2
    no_procs = await agent.tick(snap(gpu(0, util=45.0, processes_unknown=Absent.UNAVAILABLE)))
    assert only(no_procs, "vllm-a").utilization_percent is Absent.SHARED


async def test_missing_removed_and_unreadable_slices_leave_the_pod_unknown_naming_the_claim(
        agent: Agent, kubelet: KubeletPeer, kubeapi: KubeApiPeer) -> None:
    s = snap(gpu(0, util=70.0), gpu(1, util=20.0))
    kubelet.pods = [dra_pod("llm", "vllm-a", ("vllm", [
        claim("gpus", (NVIDIA, NODE, "gpu-0"), (NVIDIA, NODE, "gpu-1"))]))]
    result = await agent.tick(s)  # no slice yet: never the sum of no device
    a = only(result, "vllm-a")
    assert isinstance(a.utilization_percent, Absent)
    assert a.unmatched[0].startswith("claim llm/gpus: gpu.nvidia.com/node-1/gpu-0")
    assert any("claim llm/gpus" in r and "no ResourceSlice" in r for r in result.reasons)
    publish(kubeapi, "s-nv", NVIDIA, [nvidia_gpu(0, uuid(0)), nvidia_gpu(1, uuid(1))])
    await until(lambda: len(agent.slices.inventory().devices) == 2)  # type: ignore[union-attr]
    assert only(await agent.tick(s), "vllm-a").utilization_percent == 90.0
    # The driver republishes without gpu-1 (generation 2): a smaller sum would be wrong.
    kubeapi.modify(make_slice("s-nv", NODE, NVIDIA, NODE, [nvidia_gpu(0, uuid(0))],
                              generation=2), RESOURCESLICES)
    await until(lambda: len(agent.slices.inventory().devices) == 1)  # type: ignore[union-attr]
    a = only(await agent.tick(s), "vllm-a")
    assert isinstance(a.utilization_percent, Absent)
    assert "gpu-1" in a.unmatched[0]
    kubeapi.delete("uid-s-nv", RESOURCESLICES)  # the slice disappears mid-run
    await until(lambda: not agent.slices.inventory().devices)  # type: ignore[union-attr]
    assert len(only(await agent.tick(s), "vllm-a").unmatched) == 2
    # A pool of two slices of which one is seen: none of its devices is trusted.
    publish(kubeapi, "s-nv-1", NVIDIA, [nvidia_gpu(0, uuid(0)), nvidia_gpu(1, uuid(1))],
            count=2)
    await until(lambda: bool(agent.slices.inventory().unreadable))  # type: ignore[union-attr]
    result = await agent.tick(s)
    assert isinstance(only(result, "vllm-a").utilization_percent, Absent)
    assert any("1 of its 2 ResourceSlices seen" in r for r in result.reasons)


async def test_two_drivers_on_one_node_and_an_unknown_one(
        agent: Agent, kubelet: KubeletPeer, kubeapi: KubeApiPeer) -> None:
    amd = gpu(1, util=35.0, pci_bus_id="0000:19:00.0", uuid="amd-gpu-1")
    publish(kubeapi, "s-nv", NVIDIA, [nvidia_gpu(0, uuid(0))])
    publish(kubeapi, "s-amd", AMD, [
        ("gpu-1-129", {"type": "amdgpu", "resource.kubernetes.io/pciBusID": "0000:19:00.0"})])
    publish(kubeapi, "s-nic", "nic.example.com", [("eth-0", {"type": "nic"})])
    await until(lambda: len(agent.slices.inventory().devices) == 3)  # type: ignore[union-attr]
    s = snap(gpu(0, util=70.0), amd)
    # Drivers in either map order, one claim holding a device of each.
    kubelet.pods = [dra_pod("llm", "vllm-a", ("vllm", [
        claim("mixed", (AMD, NODE, "gpu-1-129"), (NVIDIA, NODE, "gpu-0"))]))]
    assert only(await agent.tick(s), "vllm-a").utilization_percent == 105.0
    # A driver gpuscale does not know, whose slice names no GPU: the pod is unknown.
    kubelet.pods = [dra_pod("llm", "vllm-b", ("vllm", [
        claim("gpu", (NVIDIA, NODE, "gpu-0")), claim("nic", ("nic.example.com", NODE,
                                                             "eth-0"))]))]
    result = await agent.tick(s)
    units = [u for u in result.pods if u.pod == "vllm-b"]
    assert [u.resource for u in units] == ["dra:gpu", "dra:nic"]
    assert isinstance(units[1].utilization_percent, Absent)
    assert any("claim llm/nic" in r and "names no GPU" in r for r in result.reasons)


async def test_a_claim_the_kubelet_lost_lists_no_device_and_pods_stay_known(
        agent: Agent, kubelet: KubeletPeer, kubeapi: KubeApiPeer) -> None:
    """The kubelet's quirk: a claim missing from its cache lists the container with no
    dynamic resources at all - the pod is then one without GPUs, not one with fewer."""
    publish(kubeapi, "s-nv", NVIDIA, [nvidia_gpu(0, uuid(0))])
    kubelet.pods = [dra_pod("llm", "vllm-a", ("vllm", [claim("g", (NVIDIA, NODE, "gpu-0"))]))]
    kubelet.lost_claims.add(("llm", "g"))
    result = await agent.tick(snap(gpu(0)))
    assert [u for u in result.pods if u.pod == "vllm-a"] == []
