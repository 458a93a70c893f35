"""Attribution with its real peers together: a kubelet on a unix socket, an API server over
HTTP, a /proc tree, and GPU readings; then the agent exposing the result."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from gpuscale.agent.app import Agent, AgentConfig
from gpuscale.attribution.cgroup import PidResolver
from gpuscale.attribution.kubelet import PodResourcesClient
from gpuscale.attribution.model import AttributionState, NodeAttribution
from gpuscale.attribution.pods import NodePodCache
from gpuscale.attribution.sources import ClusterSources, ScenarioSources, attribute_tick
from gpuscale.kube.api import KubeApi
from gpuscale.scaler.core.selector import parse_selector
from gpuscale.scaler.sources.roster import AgentRoster
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.stream.subscriber import AgentSubscriber
from gpuscale.telemetry.model import Absent
from gpuscale.telemetry.scenario import gpu_uuid
from gpuscale.telemetry.simulated_gpus import SimulatedBackend
from tests.e2e.attribution_node import NODE, uid
from tests.peers.kubeapi import KubeApiPeer, api_client
from tests.peers.kubelet import KubeletPeer, pod
from tests.support.polling import until


async def sources_for(kubelet: KubeletPeer, api: KubeApiPeer, proc: Path
                      ) -> tuple[ClusterSources, asyncio.Task[None], KubeApi]:
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

        async def recovered() -> bool:
            return (await attribute_tick(src, snap)).state is AttributionState.OK

        # The channel's first call after a restart may still fail on the old connection
        # ("Stream removed": a tick PARTIAL, safe); the ticks after it are OK again.
        await until(recovered, 4.0, "attribution OK again after the kubelet restarted")
        api.token = "rotated"  # the agent's token is now refused
        await api.drop_watches()

        async def degraded() -> NodeAttribution | None:
            result = await attribute_tick(src, snap)
            return None if result.state is AttributionState.OK else result

        result = await until(degraded, 4.0, "attribution degraded by the refused token")
        assert any("unauthorized (401)" in r for r in result.reasons)
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


async def test_agent_publishes_not_yet_known_until_the_pod_cache_has_synced(
        cluster: tuple[KubeletPeer, KubeApiPeer, Path]) -> None:
    """Before the pod list, the kubelet's pods have no labels or readiness: published as
    they were, they matched no workload and the workload's sum dropped to 0. The agent
    says 'not yet known' with the reason instead; the scaler keeps waiting for it."""
    kubelet, api, proc = cluster
    apic = api_client(api)
    good, api.token = api.token, "rotated"  # the agent's list is refused: no sync
    cache = NodePodCache(apic, NODE.name, backoff_s=(0.05,))
    src = ClusterSources(PodResourcesClient(kubelet.socket_path, timeout=1.0), cache,
                         PidResolver(proc), api=apic)
    backend = SimulatedBackend(NODE)
    agent = Agent(backend, AgentConfig("127.0.0.1", 0, 0.2, NODE.name, stream_port=0), src)
    fleet = FleetView()
    sub = AgentSubscriber(fleet, "test", backoff_s=(0.05,))
    roster = AgentRoster(sub)
    bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(agent.run(bound.set_result))
    try:
        await bound
        sub.set_addresses([f"127.0.0.1:{agent.stream_port}"])
        await until(lambda: sub.states()[0].incomplete, what="an incomplete update")
        state = sub.states()[0]
        assert not state.reported
        assert state.incomplete.startswith("pod metadata not known yet for dev/ts-a, "
                                           "dev/ts-b, dev/ts-c and 1 more")
        gaps = roster.problems("dev", parse_selector("app=x"), [])
        assert gaps[0].startswith(f"agent 127.0.0.1:{agent.stream_port} has not reported "
                                  f"(its attribution is not complete: pod metadata not known")
        assert fleet.pod_count() == 0  # nothing unlabelled got in
        api.token = good  # the agent's token is accepted again: the cache syncs
        await until(lambda: roster.ready()[0], what="the agent reported")
        assert {r.name for r in fleet.select("dev", parse_selector("app"))} >= {
            "ts-a", "ts-b", "ts-c", "ts-d"}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await sub.close()


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
