"""Attribution through the real GPU libraries' bindings on fake drivers (libnvidia-ml and
libamd_smi), with the kubelet and API peers and a /proc tree: time-slicing, MIG, MPS and
AMD partitions, and the faults of each - never a smaller number than the pods use."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.attribution_node import NODE, cid, uid
from tests.peers.fakenvml import DRIVER, build, gpu_line, mig_line, proc_line
from tests.peers.kubeapi import KubeApiPeer, make_pod
from tests.peers.kubelet import KubeletPeer, pod
from tests.support.kubeconfig import write_kubeconfig
from tests.support.sysfs import drm_tree

G0 = "GPU-00000000-0000-0000-0000-000000000000"  # gpu_line(0)
MIG0 = "MIG-00000000-0000-0000-0000-000000000000"  # mig_line(0, 0)


def shared_by(kubelet: KubeletPeer, device: str, n: int) -> None:
    """Pods ts-a, ts-b, ... (pids 7001, 7002, ... in the /proc tree) time-slice ``device``."""
    kubelet.pods = [pod("dev", f"ts-{c}", ("app", "nvidia.com/gpu.shared", [f"{device}::{i}"]))
                    for i, c in enumerate("abcd"[:n])]


async def attribute_on_fake_nvml(cluster: tuple[KubeletPeer, KubeApiPeer, Path],
                                 tmp_path: Path, *lines: str) -> dict[str, Any]:
    """The whole agent path in one process: real bindings on the fake libnvidia-ml, the
    kubelet and API peers (reached through a kubeconfig file) and a /proc tree."""
    kubelet, api, proc = cluster
    scenario = tmp_path / "nvml.txt"
    scenario.write_text("\n".join(lines) + "\n")
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{api.port}",
                                  {"token": api.token})
    env = {**os.environ, "LD_LIBRARY_PATH": str(build()), "FAKENVML_SCENARIO": str(scenario)}
    proc_ = await asyncio.create_subprocess_exec(
        sys.executable, str(DRIVER), "--attribute", str(kubelet.socket_path), str(proc),
        str(kubeconfig), NODE.name, env=env, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc_.communicate(), 60)
    assert proc_.returncode == 0, err.decode()
    result: dict[str, Any] = json.loads(out)
    return result


def by_pod(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["pod"]: p for p in result["attribution"]["pods"]}


def gpu_signal(result: dict[str, Any], pod_name: str) -> object:
    return result["signals"][f"dev/{pod_name}"]["gpu-utilization"]


async def test_nvml_through_the_fake_driver_attributed_via_kubeconfig(
        cluster: tuple[KubeletPeer, KubeApiPeer, Path], tmp_path: Path) -> None:
    shared_by(cluster[0], G0, 4)
    result = await attribute_on_fake_nvml(
        cluster, tmp_path, gpu_line(0, util=90, sample_us=100000),
        *(proc_line(0, 7001 + i, mem=(i + 1) * 2**30, sm=10 * (i + 1)) for i in range(4)))
    got = by_pod(result)
    assert [got[f"ts-{c}"]["utilization_percent"] for c in "abcd"] == [10.0, 20.0, 30.0, 40.0]
    assert got["ts-c"]["memory_used_bytes"] == 3 * 2**30
    assert got["ts-c"]["devices"][0]["sharers"] == 4
    assert result["attribution"]["state"] == "ok"


@pytest.mark.parametrize("busy", [True, False], ids=["one-idle", "all-idle"])
async def test_idle_time_sliced_pod_reads_zero_and_its_workload_stays_answerable(
        cluster: tuple[KubeletPeer, KubeApiPeer, Path], tmp_path: Path, busy: bool) -> None:
    # The driver lists both processes but samples only a busy one (all idle: it answers
    # NOT_FOUND). The idle pod used 0 % - a number, so its workload's sum is answerable.
    shared_by(cluster[0], G0, 2)
    result = await attribute_on_fake_nvml(
        cluster, tmp_path, gpu_line(0, util=35 if busy else 0),
        proc_line(0, 7001, mem=2**30, sm=35 if busy else 0),
        proc_line(0, 7002, mem=2 * 2**30, idle=1))
    got = by_pod(result)
    assert got["ts-a"]["utilization_percent"] == (35.0 if busy else 0.0)
    assert got["ts-b"]["utilization_percent"] == 0.0
    assert got["ts-b"]["memory_used_bytes"] == 2 * 2**30
    assert got["ts-b"]["devices"][0]["split"] == "process"
    assert gpu_signal(result, "ts-b") == 0.0
    assert result["attribution"]["state"] == "ok"


@pytest.mark.parametrize(("fault", "why"), [
    ("proc_util:999", "unavailable"),  # the per-process utilization call failed
    ("processes:999", "shared"),  # the process list itself failed: whose is unknowable
    ("proc_util:3", "unsupported"),
])
async def test_per_process_data_missing_keeps_the_pods_absent_never_zero(
        cluster: tuple[KubeletPeer, KubeApiPeer, Path], tmp_path: Path, fault: str,
        why: str) -> None:
    shared_by(cluster[0], G0, 2)
    result = await attribute_on_fake_nvml(
        cluster, tmp_path, gpu_line(0, util=35, fail=fault),
        proc_line(0, 7001, mem=2**30, sm=35), proc_line(0, 7002, mem=2**30, idle=1))
    got = by_pod(result)
    assert [got[c]["utilization_percent"] for c in ("ts-a", "ts-b")] == [why, why]
    assert [gpu_signal(result, c) for c in ("ts-a", "ts-b")] == [why, why]


async def test_pods_on_a_gpu_lost_mid_tick_read_lost(
        cluster: tuple[KubeletPeer, KubeApiPeer, Path], tmp_path: Path) -> None:
    # Lost between listing the processes and reading their utilization.
    shared_by(cluster[0], G0, 2)
    result = await attribute_on_fake_nvml(
        cluster, tmp_path, gpu_line(0, util=35, lost_after="proc_util:1"),
        proc_line(0, 7001, mem=2**30, sm=35), proc_line(0, 7002, mem=2**30, idle=1))
    got = by_pod(result)
    assert [got[c]["utilization_percent"] for c in ("ts-a", "ts-b")] == ["lost", "lost"]
    assert [got[c]["memory_used_bytes"] for c in ("ts-a", "ts-b")] == ["lost", "lost"]
    assert [gpu_signal(result, c) for c in ("ts-a", "ts-b")] == ["lost", "lost"]


async def test_time_sliced_mig_slice_without_utilization_is_unsupported_never_zero(
        cluster: tuple[KubeletPeer, KubeApiPeer, Path], tmp_path: Path) -> None:
    shared_by(cluster[0], MIG0, 2)
    result = await attribute_on_fake_nvml(
        cluster, tmp_path, gpu_line(0, mig=1), mig_line(0, 0, gi=1, gslices=3, mem_mb=40192),
        proc_line(0, 7001, mig=0, mem=2**30, sm=50), proc_line(0, 7002, mig=0, mem=2**30))
    got = by_pod(result)
    assert [got[c]["utilization_percent"] for c in ("ts-a", "ts-b")] == [
        "unsupported", "unsupported"]
    assert got["ts-b"]["memory_used_bytes"] == 2**30  # memory is per process on MIG too
    assert [gpu_signal(result, c) for c in ("ts-a", "ts-b")] == ["unsupported", "unsupported"]


async def test_pod_on_a_mig_slice_of_a_gpu_lost_mid_tick_reads_lost(
        cluster: tuple[KubeletPeer, KubeApiPeer, Path], tmp_path: Path) -> None:
    cluster[0].pods = [pod("dev", "ts-a", ("app", "nvidia.com/mig-3g.40gb", [MIG0]))]
    result = await attribute_on_fake_nvml(
        cluster, tmp_path, gpu_line(0, mig=1, gpm=1, lost_after="processes:1"),
        mig_line(0, 0, gi=1, gslices=3, mem_mb=40192, gpm_util=80),
        proc_line(0, 7001, mig=0, mem=2**30))
    got = by_pod(result)
    assert got["ts-a"]["utilization_percent"] == "lost"
    assert got["ts-a"]["devices"][0]["mig_uuid"] == MIG0
    assert gpu_signal(result, "ts-a") == "lost"


@pytest.mark.parametrize(("active_pods_only", "sources_ready"), [
    (False, False),  # before 1.34, just restarted: listed with its replica of the GPU
    (False, True),  # before 1.34: listed, its device already freed
    (True, True),  # 1.34 and later: not listed
], ids=["kubelet<1.34-restarting", "kubelet<1.34", "kubelet>=1.34"])
async def test_a_finished_pod_the_kubelet_still_lists_is_no_sharer(
        cluster: tuple[KubeletPeer, KubeApiPeer, Path], tmp_path: Path,
        active_pods_only: bool, sources_ready: bool) -> None:
    """A training Job's pod finished on a time-sliced GPU and an inference pod runs there
    now. However the kubelet lists the finished pod, the inference pod has the GPU alone:
    not split with a pod that runs nothing (which would read 30, its process's SM share,
    instead of the GPU's 90)."""
    kubelet, api, proc = cluster
    g0 = "GPU-00000000-0000-0000-0000-000000000000"
    kubelet.pods = [pod("batch", "train-0", ("main", "nvidia.com/gpu", [f"{g0}::0"])),
                    pod("llm", "serve-0", ("main", "nvidia.com/gpu", [f"{g0}::1"]))]
    kubelet.terminate("batch", "train-0")
    kubelet.active_pods_only, kubelet.sources_ready = active_pods_only, sources_ready
    api.add(make_pod("batch", "train-0", uid(10), node=NODE.name,
                     containers=(("main", cid(10)),), phase="Succeeded"))
    api.add(make_pod("llm", "serve-0", uid(11), node=NODE.name,
                     containers=(("main", cid(11)),)))
    (proc / "7301").mkdir()
    (proc / "7301" / "cgroup").write_text(f"0::/kubepods/burstable/pod{uid(11)}/{cid(11)}\n")
    att = (await attribute_on_fake_nvml(cluster, tmp_path,
                                        gpu_line(0, util=90, sample_us=100000),
                                        proc_line(0, 7301, mem=2**30, sm=30)))["attribution"]
    assert [p["pod"] for p in att["pods"]] == ["serve-0"]
    (serve,) = att["pods"]
    assert serve["utilization_percent"] == 90.0
    assert (serve["devices"][0]["sharers"], serve["devices"][0]["split"]) == (1, "exclusive")
    assert att["state"] == "ok"


MPS_SERVER = 4100000  # the fake's MPS server pid on GPU 0: on the host, no pod's


async def test_mps_clients_get_their_own_share_and_the_server_is_no_pods(
        cluster: tuple[KubeletPeer, KubeApiPeer, Path], tmp_path: Path) -> None:
    # Two pods share GPU 0 through MPS: the compute listing shows only the MPS server, the
    # pods' processes are MPS clients. Before, the clients went unlisted and both pods read
    # 0 % of a GPU they kept 70 % busy.
    shared_by(cluster[0], G0, 2)
    result = await attribute_on_fake_nvml(
        cluster, tmp_path, gpu_line(0, util=70, sample_us=100000),
        proc_line(0, 7001, mem=2**30, sm=30, mps=1), proc_line(0, 7002, mem=2 * 2**30, sm=40,
                                                                mps=1))
    got = by_pod(result)
    assert [got[c]["utilization_percent"] for c in ("ts-a", "ts-b")] == [30.0, 40.0]
    assert [got[c]["memory_used_bytes"] for c in ("ts-a", "ts-b")] == [2**30, 2 * 2**30]
    assert {got[c]["devices"][0]["split"] for c in ("ts-a", "ts-b")} == {"process"}
    assert [gpu_signal(result, c) for c in ("ts-a", "ts-b")] == [30.0, 40.0]
    # The workload's sum is not smaller than what its processes used.
    assert sum(got[c]["utilization_percent"] for c in ("ts-a", "ts-b")) >= 30.0 + 40.0
    # The server runs outside any pod: flagged as such, never counted into a pod.
    assert [(o["pid"], o["kind"]) for o in result["attribution"]["unattributed"]] == [
        (MPS_SERVER, "no_pod")]
    assert result["attribution"]["state"] == "ok"


@pytest.mark.parametrize(("fault", "why"), [
    ("mps:999", "shared"),  # the MPS listing failed: whose processes are whose is unknown
    ("mps:3", "shared"),  # this GPU's driver says it cannot list MPS clients
])
async def test_mps_listing_missing_keeps_the_pods_absent_never_zero(
        cluster: tuple[KubeletPeer, KubeApiPeer, Path], tmp_path: Path, fault: str,
        why: str) -> None:
    shared_by(cluster[0], G0, 2)
    result = await attribute_on_fake_nvml(
        cluster, tmp_path, gpu_line(0, util=70, fail=fault),
        proc_line(0, 7001, mem=2**30, sm=30, mps=1), proc_line(0, 7002, mem=2**30, sm=40,
                                                                mps=1))
    got = by_pod(result)
    assert [got[c]["utilization_percent"] for c in ("ts-a", "ts-b")] == [why, why]
    assert [got[c]["devices"][0]["split"] for c in ("ts-a", "ts-b")] == ["shared", "shared"]
    assert [gpu_signal(result, c) for c in ("ts-a", "ts-b")] == [why, why]


async def test_mps_clients_whose_work_the_driver_books_to_the_server_read_shared(
        cluster: tuple[KubeletPeer, KubeApiPeer, Path], tmp_path: Path) -> None:
    # Should the driver sample the server instead of its clients, the pods' shares are
    # unknown: SHARED, not the 0 of a client without a sample.
    shared_by(cluster[0], G0, 2)
    result = await attribute_on_fake_nvml(
        cluster, tmp_path, gpu_line(0, util=70, mps_server_sm=70),
        proc_line(0, 7001, mem=2**30, idle=1, mps=1), proc_line(0, 7002, mem=2**30, idle=1,
                                                                 mps=1))
    got = by_pod(result)
    assert [got[c]["utilization_percent"] for c in ("ts-a", "ts-b")] == ["shared", "shared"]
    assert [gpu_signal(result, c) for c in ("ts-a", "ts-b")] == ["shared", "shared"]


async def attribute_on_fake_amdsmi(cluster: tuple[KubeletPeer, KubeApiPeer, Path],
                                   tmp_path: Path, lines: list[str],
                                   render_nodes: dict[int, str] | None = None,
                                   ) -> dict[str, Any]:
    """One tick of the AMD backend (the real amdsmi package on the fake libamd_smi.so)
    through the agent's attribution, against the kubelet and API peers; ``render_nodes``
    lays out the host's /sys for partitions (none: no /sys)."""
    from tests.peers import fakeamdsmi

    kubelet, api, proc = cluster
    config = tmp_path / "amd.txt"
    config.write_text("\n".join(lines) + "\n")
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{api.port}",
                                  {"token": api.token})
    sys_root = drm_tree(tmp_path / "sys", render_nodes or {})
    driver = Path(fakeamdsmi.__file__).parent / "drive.py"
    proc_ = await asyncio.create_subprocess_exec(
        sys.executable, str(driver), str(kubelet.socket_path), str(proc), str(kubeconfig),
        NODE.name, str(sys_root), env=fakeamdsmi.env(fakeamdsmi.build(), config),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc_.communicate(), 60)
    assert proc_.returncode == 0, err.decode()
    result: dict[str, Any] = json.loads(out)
    return result


async def test_amd_gpus_through_the_real_amdsmi_attributed_by_pci_address(
        cluster: tuple[KubeletPeer, KubeApiPeer, Path], tmp_path: Path) -> None:
    """An AMD node end to end: the real amdsmi package on the fake libamd_smi.so, the
    AMD device plugin's allocations (amd.com/gpu, PCI addresses) from the kubelet, pod
    metadata from the API: each pod gets its GPU's activity; a lost GPU's pod reads lost,
    never 0."""
    from tests.peers import fakeamdsmi

    cluster[0].pods = [pod("dev", "ts-a", ("app", "amd.com/gpu", ["0000:05:00.0"])),
                       pod("dev", "ts-b", ("app", "amd.com/gpu", ["0000:06:00.0"]))]
    result = await attribute_on_fake_amdsmi(cluster, tmp_path, [
        fakeamdsmi.gpu_line(0, gfx=63, vram_used=40960),
        fakeamdsmi.gpu_line(1, lost_after=9),  # gone after its first sample
        fakeamdsmi.proc_line(0, 7001, name="python3", vram=40 * 2**30)])
    got = by_pod(result)
    assert got["ts-a"]["utilization_percent"] == 63.0
    assert got["ts-a"]["memory_used_bytes"] == 40960 * 2**20
    assert gpu_signal(result, "ts-a") == 63.0
    assert gpu_signal(result, "ts-b") == "lost"


async def test_amd_cpx_partitions_each_pod_gets_its_own_partitions_share(
        cluster: tuple[KubeletPeer, KubeApiPeer, Path], tmp_path: Path) -> None:
    """An MI300X in CPX mode offered as amd.com/cpx_nps1: the device plugin names the
    first partition by the GPU's PCI address and the others amdgpu_xcp_<n>. Each pod reads
    its own partition's busy share - the one on the busy partition 90, not the GPU's
    average of 12 - and a pod holding a partition this node cannot name (and one holding
    a name no partition has) reads unknown, never a number."""
    from tests.peers import fakeamdsmi

    names = {p: fakeamdsmi.xcp_name(0, p) for p in range(8)}
    cluster[0].pods = [
        pod("dev", "ts-a", ("app", "amd.com/cpx_nps1", [names[0]])),
        pod("dev", "ts-b", ("app", "amd.com/cpx_nps1", [names[3]])),
        pod("dev", "ts-c", ("app", "amd.com/cpx_nps1", [names[5], "amdgpu_xcp_99"])),
        pod("dev", "ts-d", ("app", "amd.com/cpx_nps1", [names[6]]))]
    lines, render_nodes = fakeamdsmi.partitioned_gpu(0, gfx=12, busy=(5, 0, 0, 90, 0, 1, 0),
                                                     vram_used=2048)
    del render_nodes[128 + 6]  # partition 6's render node is missing from this /sys
    result = await attribute_on_fake_amdsmi(
        cluster, tmp_path, [*lines, fakeamdsmi.proc_line(3, 7001, vram=2**30)],
        render_nodes)
    got = by_pod(result)
    assert got["ts-a"]["utilization_percent"] == 5.0
    assert got["ts-b"]["utilization_percent"] == 90.0
    assert got["ts-b"]["memory_used_bytes"] == 2048 * 2**20
    assert got["ts-b"]["devices"][0]["mig_profile"] == "cpx.nps1"
    assert [gpu_signal(result, c) for c in ("ts-a", "ts-b")] == [5.0, 90.0]
    assert not isinstance(gpu_signal(result, "ts-c"), float)  # one device nobody has
    assert not isinstance(gpu_signal(result, "ts-d"), float)  # its name is unreadable
    assert "amdgpu_xcp_99" in result["attribution"]["unknown_devices"]


@pytest.mark.parametrize(("fault", "shared", "want"), [
    ("", False, 80.0),  # nothing fails: the partition's own 80, not the GPU's 10
    ("lost=1", False, "no_data"),  # the GPU gone before it was ever read: nothing matches
    ("lost_after=5", False, "no_data"),  # gone in the middle of its first tick
    ("unsupported=metrics", False, "unsupported"),  # no per-partition busy shares
    ("unsupported=kfd", False, "unsupported"),  # partition IDs unreadable: whose share?
    ("unsupported=enumeration", False, "no_data"),  # no render nodes: partitions unnamed
    ("unsupported=process", True, "shared"),  # a shared partition with no process list
    ("hidden_all", True, "shared"),  # a shared partition whose processes are not listed
    ("", True, "shared"),  # shared and readable: still no per-process busy share
], ids=str)
async def test_amd_partition_faults_never_give_a_smaller_number(
        cluster: tuple[KubeletPeer, KubeApiPeer, Path], tmp_path: Path, fault: str,
        shared: bool, want: float | str) -> None:
    """The fault matrix on a CPX MI300X: what the pod truly uses is its partition's 80 %.
    Whatever fails, its GPU signal is that number, or no number - never less. Two pods
    sharing the partition: neither has a number (each could be using any part of 80; the
    library gives no per-process busy share of compute work)."""
    from tests.peers import fakeamdsmi

    names = {p: fakeamdsmi.xcp_name(0, p) for p in range(8)}
    holders = ["ts-a", "ts-b"] if shared else ["ts-a"]
    cluster[0].pods = [pod("dev", h, ("app", "amd.com/cpx_nps1",  # replicas if shared
                                      [f"{names[1]}::{i}" if shared else names[1]]))
                       for i, h in enumerate(holders)]
    key, _, value = fault.partition("=")
    extra: dict[str, Any] = {key: value} if value else {}
    lines, render_nodes = fakeamdsmi.partitioned_gpu(0, gfx=10, busy=(0, 80), **extra)
    hidden = {"hidden": 1} if fault == "hidden_all" else {}
    result = await attribute_on_fake_amdsmi(cluster, tmp_path, [
        *lines, fakeamdsmi.proc_line(1, 7001, vram=2**30, **hidden),
        fakeamdsmi.proc_line(1, 7002, vram=2**30, **hidden)], render_nodes)
    assert [gpu_signal(result, h) for h in holders] == [want] * len(holders)
