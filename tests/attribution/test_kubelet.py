"""The PodResources client against a test kubelet on a real unix socket."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpuscale.attribution.kubelet import KubeletError, PodResourcesClient
from gpuscale.attribution.model import DeviceKind
from gpuscale.proto import podresources_v1_pb2 as pb
from tests.peers.kubelet import KubeletPeer, claim, dra_pod, pod

U = "11111111-2222-3333-4444-{:012d}"


def gpu(i: int, replica: int | None = None) -> str:
    return f"GPU-{U.format(i)}" + ("" if replica is None else f"::{replica}")


@pytest.fixture
async def client(kubelet: KubeletPeer) -> AsyncIterator[PodResourcesClient]:
    c = PodResourcesClient(kubelet.socket_path, timeout=1.0)
    yield c
    await c.close()


async def test_whole_gpus_mig_and_shared_device_ids(kubelet: KubeletPeer,
                                                   client: PodResourcesClient) -> None:
    kubelet.pods = [
        pod("llm", "vllm-0", ("vllm", "nvidia.com/gpu", [gpu(0), gpu(1)])),
        pod("dev", "ts-a", ("app", "nvidia.com/gpu.shared", [gpu(2, 0)])),
        pod("dev", "ts-b", ("app", "nvidia.com/gpu", [gpu(2, 3)])),
        pod("batch", "mig-a", ("w", "nvidia.com/mig-3g.40gb", [f"MIG-{U.format(7)}"])),
        pod("batch", "mig-b", ("w", "nvidia.com/mig-1g.10gb",
                               [f"MIG-{gpu(3)}/7/0", f"MIG-{gpu(3)}/8/0::2"])),
        pod("web", "nginx", ("nginx", "cpu", ["0"])),
    ]
    got = await client.list()
    assert got.problems == ()
    by_pod = {(a.namespace, a.pod): a for a in got.allocations}
    assert set(by_pod) == {("llm", "vllm-0"), ("dev", "ts-a"), ("dev", "ts-b"),
                           ("batch", "mig-a"), ("batch", "mig-b")}
    assert [d.uuid for d in by_pod["llm", "vllm-0"].devices] == [gpu(0), gpu(1)]
    assert by_pod["dev", "ts-b"].devices[0].replica == 3
    old = by_pod["batch", "mig-b"].devices
    assert [(d.kind, d.uuid, d.gpu_instance_id, d.compute_instance_id, d.replica)
            for d in old] == [(DeviceKind.MIG, gpu(3), 7, 0, None),
                              (DeviceKind.MIG, gpu(3), 8, 0, 2)]


async def test_malformed_ids_and_unknown_resources_are_reported_not_guessed(
        kubelet: KubeletPeer, client: PodResourcesClient) -> None:
    kubelet.pods = [pod("a", "p", ("c", "nvidia.com/gpu", [gpu(0), "GPU-zzz", "0", ""]),
                        ("d", "nvidia.com/gpu-typo", [gpu(1)]))]
    got = await client.list()
    # The IDs it cannot read stay, unmatched: the pod holds devices nobody can read, so
    # its sums are unknown rather than those of gpu(0) alone.
    assert [(d.raw, d.kind.value) for a in got.allocations for d in a.devices] == [
        (gpu(0), "gpu"), ("GPU-zzz", "unknown"), ("0", "unknown"), ("", "unknown")]
    assert len(got.problems) == 4
    assert "'GPU-zzz' is not GPU-<uuid>" in got.problems[0]
    assert "unrecognised resource 'nvidia.com/gpu-typo'" in got.problems[3]


async def test_extra_resource_names(kubelet: KubeletPeer) -> None:
    kubelet.pods = [pod("a", "p", ("c", "example.com/h100", [gpu(5)]))]
    c = PodResourcesClient(kubelet.socket_path, extra_resources=("example.com/h100",))
    try:
        assert [a.resource for a in (await c.list()).allocations] == ["example.com/h100"]
    finally:
        await c.close()


async def test_dra_claims_come_as_driver_pool_device_with_their_claim(
        kubelet: KubeletPeer, client: PodResourcesClient) -> None:
    """The device name carries no UUID (NVIDIA's ``gpu-0``): the client keeps the claim and
    (driver, pool, device) for the node's ResourceSlices to name; the kubelet's quirks
    (cumulative CDI lists, a share id, a resource with no device name) change nothing."""
    kubelet.pods = [dra_pod("a", "p", ("c", [claim(
        "two-gpus", ("gpu.nvidia.com", "node-1", "gpu-0"), ("gpu.nvidia.com", "node-1",
                                                             "gpu-1"),
        share_ids={"gpu-1": "7f3c"})]))]
    kubelet.pods[0].containers[0].dynamic_resources[0].claim_resources.append(
        pb.ClaimResource(driver_name="future.example.com", pool_name="x"))
    got = await client.list()
    (a,) = got.allocations
    assert a.resource == "dra:two-gpus"
    assert [(d.kind, d.dra, d.claim) for d in a.devices] == [
        (DeviceKind.DRA, ("gpu.nvidia.com", "node-1", "gpu-0"), "a/two-gpus"),
        (DeviceKind.DRA, ("gpu.nvidia.com", "node-1", "gpu-1"), "a/two-gpus")]
    assert a.devices[0].raw == "claim a/two-gpus: gpu.nvidia.com/node-1/gpu-0"
    assert "with no device name ignored" in got.problems[0]
    cdi = kubelet.pods[0].containers[0].dynamic_resources[0].claim_resources[1].cdi_devices
    assert len(cdi) == 2  # the real kubelet's shared CDI list, reproduced


async def test_dra_names_beyond_the_api_bounds_are_unknown_and_ignored_drivers_left_out(
        kubelet: KubeletPeer, tmp_path: Path) -> None:
    c = PodResourcesClient(kubelet.socket_path, timeout=1.0, dra_ignore=("nic.example.com",))
    kubelet.pods = [dra_pod("a", "p", ("c", [
        claim("big", ("gpu.nvidia.com", "node-1", "g" * 64)),
        claim("nic", ("nic.example.com", "node-1", "eth-0"))]))]
    try:
        got = await c.list()
    finally:
        await c.close()
    (a,) = got.allocations  # the NIC's claim holds nothing gpuscale reads
    assert a.resource == "dra:big"
    assert a.devices[0].kind is DeviceKind.UNKNOWN
    assert "claim a/big" in a.devices[0].raw


async def test_allocatable(kubelet: KubeletPeer, client: PodResourcesClient) -> None:
    kubelet.allocatable = [pb.ContainerDevices(resource_name="nvidia.com/gpu",
                                               device_ids=[gpu(0), gpu(1), "bad"])]
    assert [d.uuid for d in await client.allocatable()] == [gpu(0), gpu(1)]


async def test_pod_restarting_with_new_devices(kubelet: KubeletPeer,
                                               client: PodResourcesClient) -> None:
    kubelet.pods = [pod("llm", "vllm-0", ("vllm", "nvidia.com/gpu", [gpu(0)]))]
    assert [d.uuid for a in (await client.list()).allocations for d in a.devices] == [gpu(0)]
    kubelet.pods = [pod("llm", "vllm-0", ("vllm", "nvidia.com/gpu", [gpu(6)]))]
    assert [d.uuid for a in (await client.list()).allocations for d in a.devices] == [gpu(6)]


async def test_kubelet_restart_socket_vanishes_and_comes_back(
        kubelet: KubeletPeer, client: PodResourcesClient) -> None:
    kubelet.pods = [pod("a", "p", ("c", "nvidia.com/gpu", [gpu(0)]))]
    assert len((await client.list()).allocations) == 1
    await kubelet.stop()
    with pytest.raises(KubeletError, match="does not exist"):
        await client.list()
    await kubelet.start()
    assert len((await client.list()).allocations) == 1


async def test_slow_kubelet_times_out(kubelet: KubeletPeer) -> None:
    kubelet.delay = 2.0
    c = PodResourcesClient(kubelet.socket_path, timeout=0.3)
    try:
        with pytest.raises(KubeletError, match="did not answer"):
            await c.list()
    finally:
        await c.close()


async def test_socket_without_permission(kubelet: KubeletPeer) -> None:
    # An agent that may not open the socket. As root, drop the capabilities that bypass file
    # permissions (setpriv, util-linux) and hand the socket to another user.
    path = kubelet.socket_path
    prefix: list[str] = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        assert setpriv, "setpriv (util-linux) is needed to test permissions as root"
        os.chown(path, 65534, 65534)
        path.chmod(0o600)
        prefix = [setpriv, "--bounding-set=-dac_override,-dac_read_search"]
    else:
        path.chmod(0)
    script = ("import asyncio\n"
              "from pathlib import Path\n"
              "from gpuscale.attribution.kubelet import KubeletError, PodResourcesClient\n"
              "async def main():\n"
              "    try:\n"
              f"        await PodResourcesClient(Path({str(path)!r})).list()\n"
              "    except KubeletError as exc:\n"
              "        print(exc)\n"
              "asyncio.run(main())\n")
    proc = await asyncio.create_subprocess_exec(
        *prefix, sys.executable, "-c", script, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert f"permission denied on {path}" in out.decode(), out.decode() + err.decode()


async def test_path_that_is_not_a_socket(tmp_path: Path) -> None:
    path = tmp_path / "kubelet.sock"
    path.write_text("not a socket")
    c = PodResourcesClient(path, timeout=1.0)
    try:
        with pytest.raises(KubeletError, match="kubelet unavailable"):
            await c.list()
    finally:
        await c.close()


async def test_socket_paths_with_odd_characters(tmp_path: Path) -> None:
    for name in ("gs a b.sock", "gs%20x.sock"):
        k = KubeletPeer(Path(f"/tmp/{os.getpid()}-{name}"))
        await k.start()
        c = PodResourcesClient(k.socket_path)
        try:
            assert (await c.list()).allocations == ()
        finally:
            await c.close()
            await k.stop()
    with pytest.raises(ValueError, match="may not contain ','"):
        PodResourcesClient(Path("/tmp/a,b.sock"))
