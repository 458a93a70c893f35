"""Attribution with its real peers together: a kubelet on a unix socket, an API server over
HTTP, a /proc tree, and GPU readings; then the agent exposing the result."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import aiohttp
import pytest
import yaml
from kubernetes_asyncio import client

from gpuscale.agent.app import Agent, AgentConfig
from gpuscale.attribution.cgroup import PidResolver
from gpuscale.attribution.kubelet import PodResourcesClient
from gpuscale.attribution.model import AttributionState, NodeAttribution
from gpuscale.attribution.pods import NodePodCache
from gpuscale.attribution.sources import ClusterSources, ScenarioSources, attribute_tick
from gpuscale.telemetry.model import Absent
from gpuscale.telemetry.scenario import gpu_uuid, load_scenario
from gpuscale.telemetry.simulated import SimulatedBackend
from tests.conftest import until
from tests.peers.fakenvml import DRIVER, build, gpu_line, proc_line
from tests.peers.kubeapi import KubeApiPeer, api_client, make_pod
from tests.peers.kubelet import KubeletPeer, pod

NODE = load_scenario("timesliced-node").nodes[0]  # GPU 0: 4 pods time-slicing


def uid(i: int) -> str:
    return f"aaaaaaaa-0000-4000-8000-{i:012d}"


def cid(i: int) -> str:
    return f"{i:064x}"


@pytest.fixture
def cluster(kubelet: KubeletPeer, kubeapi: KubeApiPeer,
            tmp_path: Path) -> tuple[KubeletPeer, KubeApiPeer, Path]:
    api = kubeapi
    g0 = gpu_uuid(NODE.name, 0)
    # The four time-slicing pods of GPU 0 (pids 7001-7004 in the scenario).
    kubelet.pods = [pod("dev", f"ts-{c}", ("app", "nvidia.com/gpu.shared", [f"{g0}::{i}"]))
                    for i, c in enumerate("abcd")]
    for i, c in enumerate("abcd"):
        api.add(make_pod("dev", f"ts-{c}", uid(i), node=NODE.name,
                         containers=(("app", cid(i)),)))
    proc = tmp_path / "proc"
    for pid, text in {1: "0::/init.scope\n",
                      **{7001 + i: f"0::/kubepods/besteffort/pod{uid(i)}/{cid(i)}\n"
                         for i in range(4)},
                      7101: "0::/system.slice/stray.service\n"}.items():
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text(text)
    return kubelet, api, proc


async def sources_for(kubelet: KubeletPeer, api: KubeApiPeer, proc: Path
                      ) -> tuple[ClusterSources, asyncio.Task[None], client.ApiClient]:
    apic = api_client(api)
    cache = NodePodCache(apic, NODE.name, backoff_s=(0.05,))
    src = ClusterSources(PodResourcesClient(kubelet.socket_path, timeout=1.0), cache,
                         PidResolver(proc), api=apic)
    task = asyncio.create_task(src.run())
    await until(lambda: not isinstance(cache.pods(), Absent), 4.0, "the first pod list")
    return src, task, apic


async def test_time_sliced_pods_get_their_own_processes(
        cluster: tuple[KubeletPeer, KubeApiPeer, Path]) -> None:
    kubelet, api, proc = cluster
    src, task, _ = await sources_for(kubelet, api, proc)
    try:
        snap = SimulatedBackend(NODE).sample()
        result = await attribute_tick(src, snap)
        got = {p.pod: p for p in result.pods}
        assert [got[f"ts-{c}"].utilization_percent for c in "abcd"] == [10.0, 20.0, 5.0, 5.0]
        assert got["ts-b"].memory_used_bytes == 5000 * 2**20
        assert got["ts-a"].pod_info is not None
        assert got["ts-a"].pod_info.uid == uid(0)
        assert {d.split for p in result.pods for d in p.devices} == {"process"}
        # The processes on GPUs 1 and 2 run outside any pod here: flagged, not attributed.
        assert {(o.pid, o.kind) for o in result.unattributed} == {
            (7101, "no_pod"), (7102, "no_pod"), (7201, "no_pod")}
        assert result.state is AttributionState.OK
        assert set(result.idle_gpus) == {gpu_uuid(NODE.name, i) for i in (1, 2, 3)}
    finally:
        task.cancel()
        await src.close()


async def test_kubelet_restart_and_api_outage_degrade_then_recover(
        cluster: tuple[KubeletPeer, KubeApiPeer, Path]) -> None:
    kubelet, api, proc = cluster
    src, task, _ = await sources_for(kubelet, api, proc)
    snap = SimulatedBackend(NODE).sample()
    try:
        assert (await attribute_tick(src, snap)).state is AttributionState.OK
        await kubelet.stop()
        during = await attribute_tick(src, snap)  # within the grace period: last good List
        assert during.state is AttributionState.PARTIAL
        assert any("does not exist" in r for r in during.reasons)
        assert len(during.pods) == 4
        await kubelet.start()
        assert (await attribute_tick(src, snap)).state is AttributionState.OK
        api.token = "rotated"  # the agent's token is now refused
        await api.drop_watches()

        async def degraded() -> NodeAttribution | None:
            result = await attribute_tick(src, snap)
            return None if result.state is AttributionState.OK else result

        result = await until(degraded, 4.0, "attribution degraded by the refused token")
        assert any("forbidden (403)" in r for r in result.reasons)
        assert len(result.pods) == 4  # still attributed from the last known pods
    finally:
        task.cancel()
        await src.close()


async def test_pod_known_to_the_kubelet_but_not_yet_to_the_api(
        cluster: tuple[KubeletPeer, KubeApiPeer, Path]) -> None:
    kubelet, api, proc = cluster
    kubelet.pods.append(pod("dev", "brand-new", ("app", "nvidia.com/gpu",
                                                 [gpu_uuid(NODE.name, 3)])))
    src, task, _ = await sources_for(kubelet, api, proc)
    try:
        result = await attribute_tick(src, SimulatedBackend(NODE).sample())
        assert result.state is AttributionState.PARTIAL
        assert "not in the API cache yet: dev/brand-new" in " ".join(result.reasons)
        new = next(p for p in result.pods if p.pod == "brand-new")
        assert new.utilization_percent == 0.0  # a whole GPU: the device's own reading
    finally:
        task.cancel()
        await src.close()


async def test_agent_exposes_pods_the_dcgm_way() -> None:
    agent = Agent(SimulatedBackend(NODE), AgentConfig(host="127.0.0.1", port=0,
                                                      interval=0.5, hostname="n"),
                  ScenarioSources(NODE))
    bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(agent.run(bound.set_result))
    port = await bound
    try:
        await agent.sampler.wait_for(1)
        async with aiohttp.ClientSession() as http, http.get(
                f"http://127.0.0.1:{port}/metrics") as r:
            body = await r.text()
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    util = [line for line in body.splitlines()
            if line.startswith("DCGM_FI_DEV_GPU_UTIL{") and 'gpu="0"' in line]
    # One series per sharing pod on the time-sliced GPU, each with the device's value.
    assert len(util) == 4
    assert all('namespace="dev"' in line and line.endswith(" 40.0") for line in util)
    assert {line.split('pod="')[1].split('"')[0] for line in util} == {
        "ts-a", "ts-b", "ts-c", "ts-d"}
    assert ('gpuscale_pod_gpu_utilization{container="app",namespace="dev",pod="ts-b",'
            'resource="nvidia.com/gpu.shared"} 20.0') in body
    assert 'gpuscale_agent_attribution_state{state="ok"} 1.0' in body
    unheld = [line for line in body.splitlines()
              if line.startswith("DCGM_FI_DEV_GPU_UTIL{") and 'gpu="3"' in line]
    assert len(unheld) == 1
    assert "pod=" not in unheld[0]
    assert f'gpuscale_gpu_unallocated{{UUID="{gpu_uuid(NODE.name, 3)}"}} 1.0' in body


async def test_nvml_through_the_fake_driver_attributed_via_kubeconfig(
        cluster: tuple[KubeletPeer, KubeApiPeer, Path], tmp_path: Path) -> None:
    """The whole agent path in one process: real bindings on the fake libnvidia-ml, the
    kubelet and API peers (reached through a kubeconfig file) and a /proc tree."""
    kubelet, api, proc = cluster
    g0 = "GPU-00000000-0000-0000-0000-000000000000"
    kubelet.pods = [pod("dev", f"ts-{c}", ("app", "nvidia.com/gpu.shared", [f"{g0}::{i}"]))
                    for i, c in enumerate("abcd")]
    scenario = tmp_path / "nvml.txt"
    scenario.write_text("\n".join([
        gpu_line(0, util=90, sample_us=100000),
        *(proc_line(0, 7001 + i, mem=(i + 1) * 2**30, sm=10 * (i + 1)) for i in range(4)),
    ]) + "\n")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "t",
        "clusters": [{"name": "t", "cluster": {"server": f"http://127.0.0.1:{api.port}"}}],
        "users": [{"name": "t", "user": {"token": api.token}}],
        "contexts": [{"name": "t", "context": {"cluster": "t", "user": "t"}}]}))
    env = {**os.environ, "LD_LIBRARY_PATH": str(build()), "FAKENVML_SCENARIO": str(scenario)}
    proc_ = await asyncio.create_subprocess_exec(
        sys.executable, str(DRIVER), "--attribute", str(kubelet.socket_path), str(proc),
        str(kubeconfig), NODE.name, env=env, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc_.communicate(), 60)
    assert proc_.returncode == 0, err.decode()
    att = json.loads(out)["attribution"]
    got = {p["pod"]: p for p in att["pods"]}
    assert [got[f"ts-{c}"]["utilization_percent"] for c in "abcd"] == [10.0, 20.0, 30.0, 40.0]
    assert got["ts-c"]["memory_used_bytes"] == 3 * 2**30
    assert got["ts-c"]["devices"][0]["sharers"] == 4
    assert att["state"] == "ok"


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
    scenario = tmp_path / "nvml.txt"
    scenario.write_text(gpu_line(0, util=90, sample_us=100000) + "\n"
                        + proc_line(0, 7301, mem=2**30, sm=30) + "\n")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "t",
        "clusters": [{"name": "t", "cluster": {"server": f"http://127.0.0.1:{api.port}"}}],
        "users": [{"name": "t", "user": {"token": api.token}}],
        "contexts": [{"name": "t", "context": {"cluster": "t", "user": "t"}}]}))
    env = {**os.environ, "LD_LIBRARY_PATH": str(build()), "FAKENVML_SCENARIO": str(scenario)}
    driver = await asyncio.create_subprocess_exec(
        sys.executable, str(DRIVER), "--attribute", str(kubelet.socket_path), str(proc),
        str(kubeconfig), NODE.name, env=env, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(driver.communicate(), 60)
    assert driver.returncode == 0, err.decode()
    att = json.loads(out)["attribution"]
    assert [p["pod"] for p in att["pods"]] == ["serve-0"]
    (serve,) = att["pods"]
    assert serve["utilization_percent"] == 90.0
    assert (serve["devices"][0]["sharers"], serve["devices"][0]["split"]) == (1, "exclusive")
    assert att["state"] == "ok"
