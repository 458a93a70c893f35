"""A mixed fleet: an NVIDIA node with MIG (simulated GPUs) and an AMD node (the AMD backend
through the real ``amdsmi`` on the fake libamd_smi.so, the AMD device plugin's allocations
from the kubelet peer, pod metadata from the API peer, PIDs from a /proc tree). Both agents
stream to one subscriber; KEDA's GetMetrics answers each workload from its own vendor's
GPUs, and a GPU lost on the AMD node makes its workload UNAVAILABLE, never a smaller sum."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from types import ModuleType

import grpc
import pytest

from gpuscale.agent.app import Agent, AgentConfig
from gpuscale.attribution.cgroup import PidResolver
from gpuscale.attribution.kubelet import PodResourcesClient
from gpuscale.attribution.pods import NodePodCache
from gpuscale.attribution.sources import ClusterSources, ScenarioSources
from gpuscale.proto import externalscaler_pb2 as pb
from gpuscale.proto import externalscaler_pb2_grpc as pb_grpc
from gpuscale.scaler.answers import Answers
from gpuscale.scaler.edges.keda import ScalerServer, ScalerService
from gpuscale.scaler.sources.roster import AgentRoster
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.stream.subscriber import AgentSubscriber
from gpuscale.telemetry.amdsmi_backend import AmdSmiBackend, _load_amdsmi
from gpuscale.telemetry.scenario import load_scenario
from gpuscale.telemetry.simulated_gpus import SimulatedBackend
from tests.peers import fakeamdsmi
from tests.peers.kubeapi import KubeApiPeer, api_client, make_pod
from tests.peers.kubelet import KubeletPeer, pod
from tests.support.polling import until

AMD_NODE = "mi300x-node"
MIG = load_scenario("mig-node").nodes[0]  # triton-embed-0/1, tgi-small-0, ocr-worker-*


def _uid(i: int) -> str:
    return f"bbbbbbbb-0000-4000-8000-{i:012d}"


def _cid(i: int) -> str:
    return f"{0xabc0 + i:064x}"


@pytest.fixture
async def amd_agent(kubelet: KubeletPeer, kubeapi: KubeApiPeer,
                    tmp_path: Path) -> AsyncIterator[tuple[Agent, Path]]:
    """The AMD node's agent: two chat pods on GPUs 0 and 1 (PCI 0000:05/06:00.0)."""
    config = tmp_path / "amd.txt"
    config.write_text("\n".join([
        fakeamdsmi.gpu_line(0, gfx=63), fakeamdsmi.gpu_line(1, gfx=21),
        fakeamdsmi.proc_line(0, 8001, name="python3", vram=2**30),
        fakeamdsmi.proc_line(1, 8002, name="python3", vram=2**30)]) + "\n")
    root = fakeamdsmi.build()
    os.environ["FAKEAMDSMI_CONFIG"] = str(config)  # read by the library at each init

    def load() -> ModuleType:  # the real package, finding the fake as on a node
        os.environ["ROCM_PATH"] = str(root)
        return _load_amdsmi()

    kubelet.pods = [pod("llm", f"chat-{i}", ("engine", "amd.com/gpu", [f"0000:0{5 + i}:00.0"]))
                    for i in range(2)]
    for i in range(2):
        kubeapi.add(make_pod("llm", f"chat-{i}", _uid(i), node=AMD_NODE,
                             containers=(("engine", _cid(i)),), labels={"app": "chat"}))
    proc = tmp_path / "proc"
    for i in range(2):
        (proc / str(8001 + i)).mkdir(parents=True)
        (proc / str(8001 + i) / "cgroup").write_text(
            f"0::/kubepods/besteffort/pod{_uid(i)}/{_cid(i)}\n")
    api = api_client(kubeapi)
    sources = ClusterSources(PodResourcesClient(kubelet.socket_path, timeout=1.0),
                             NodePodCache(api, AMD_NODE, backoff_s=(0.05,)),
                             PidResolver(proc), api=api)
    agent = Agent(AmdSmiBackend(AMD_NODE, load=load),
                  AgentConfig("127.0.0.1", 0, 0.2, AMD_NODE, 0), sources)
    bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(agent.run(bound.set_result))
    await bound
    try:
        yield agent, config
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await api.close()
        os.environ.pop("FAKEAMDSMI_CONFIG", None)


async def test_one_scaler_answers_nvidia_mig_and_amd_workloads(
        amd_agent: tuple[Agent, Path]) -> None:
    amd, config = amd_agent
    mig = Agent(SimulatedBackend(MIG), AgentConfig("127.0.0.1", 0, 0.2, MIG.name, 0),
                ScenarioSources(MIG))
    bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    mig_task = asyncio.create_task(mig.run(bound.set_result))
    await bound
    fleet = FleetView()
    sub = AgentSubscriber(fleet, "test", backoff_s=(0.05,))
    sub.set_addresses({f"127.0.0.1:{amd.stream_port}": AMD_NODE,
                       f"127.0.0.1:{mig.stream_port}": MIG.name})
    server = ScalerServer(ScalerService(Answers(fleet, roster=AgentRoster(sub))),
                          host="127.0.0.1", port=0)
    await server.start()

    async def value(app: str) -> float | str:
        ref = pb.ScaledObjectRef(name=app, namespace="llm", scalerMetadata={
            "podSelector": f"app={app}", "profile": "gpu-utilization"})
        try:
            got = await stub.GetMetrics(pb.GetMetricsRequest(
                scaledObjectRef=ref, metricName="s0-gpuscale-gpu-utilization"), timeout=5)
        except grpc.aio.AioRpcError as exc:
            return f"{exc.code().name}: {exc.details()}"
        return float(got.metricValues[0].metricValueFloat)

    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = pb_grpc.ExternalScalerStub(channel)
        try:
            # AMD: the sum of the two chat pods' GFX activity (63 + 21).
            assert await until(lambda: _equals(value("chat"), 84.0), 15.0,
                               "the AMD workload's value")
            # NVIDIA MIG: the Triton pods on their MIG slices, from the same scaler.
            triton = await until(lambda: _number(value("triton-embed")), 15.0,
                                 "the MIG workload's value")
            assert triton > 0
            # GPU 1 of the AMD node falls off the bus: its pod's reading is lost, so the
            # workload is UNAVAILABLE - never the 63 of the GPU that is left.
            config.write_text(config.read_text().replace(
                "gpu idx=1 ", "gpu idx=1 lost=1 "))  # (the fake reads it again)
            got = await until(lambda: _unavailable(value("chat")), 15.0,
                              "the AMD workload UNAVAILABLE")
            assert "chat-1" in str(got)
        finally:
            await server.stop(0.2)
            await sub.close()
            mig_task.cancel()
            await asyncio.gather(mig_task, return_exceptions=True)


async def _equals(got: Awaitable[float | str], want: float) -> bool:
    return await got == want


async def _number(got: Awaitable[float | str]) -> float | None:
    v = await got
    return v if isinstance(v, float) else None


async def _unavailable(got: Awaitable[float | str]) -> str | None:
    v = await got
    return v if isinstance(v, str) and v.startswith("UNAVAILABLE") else None
