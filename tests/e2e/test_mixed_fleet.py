"""A mixed fleet: an NVIDIA node with MIG (simulated GPUs) and an AMD node (the AMD backend
through the real ``amdsmi`` on the fake libamd_smi.so: an MI300X in CPX mode - 8
partitions - and one whole MI300X; the AMD device plugin's allocations from the kubelet
peer, pod metadata from the API peer, PIDs from a /proc tree, render nodes from a sysfs
tree). Both agents stream to one subscriber; KEDA's GetMetrics, the custom metrics API (its
local mode, over HTTPS) and Explain answer each workload from its own vendor's GPUs and
partitions, and a partition lost on the AMD node makes its workload UNAVAILABLE, never a
smaller sum."""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp
import grpc
import pytest

from gpuscale.agent.app import Agent, AgentConfig
from gpuscale.attribution.cgroup import PidResolver
from gpuscale.attribution.kubelet import PodResourcesClient
from gpuscale.attribution.pods import NodePodCache
from gpuscale.attribution.sources import ClusterSources, ScenarioSources
from gpuscale.metrics_api.answers import MetricAnswers
from gpuscale.metrics_api.local import LocalAccess
from gpuscale.metrics_api.server import MetricsApiServer
from gpuscale.proto import externalscaler_pb2 as pb
from gpuscale.proto import externalscaler_pb2_grpc as pb_grpc
from gpuscale.proto import inspect_pb2 as ipb
from gpuscale.proto import inspect_pb2_grpc as ipb_grpc
from gpuscale.scaler.answers import Answers
from gpuscale.scaler.edges.inspect import SERVICE, Inspector, add_to_server
from gpuscale.scaler.edges.keda import ScalerServer, ScalerService
from gpuscale.scaler.recorder import Recorder
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
from tests.support.sysfs import drm_tree

AMD_NODE = "mi300x-node"
MIG = load_scenario("mig-node").nodes[0]  # triton-embed-0/1, tgi-small-0, ocr-worker-*


def _uid(i: int) -> str:
    return f"bbbbbbbb-0000-4000-8000-{i:012d}"


def _cid(i: int) -> str:
    return f"{0xabc0 + i:064x}"


@pytest.fixture
async def amd_agent(kubelet: KubeletPeer, kubeapi: KubeApiPeer,
                    tmp_path: Path) -> AsyncIterator[tuple[Agent, Path]]:
    """The AMD node's agent: GPU 0 in CPX mode (8 partitions, the GPU's activity 10 %),
    chat-0 on its partition 0 (63 %, named by the GPU's PCI address) and chat-1 on
    partition 3 (21 %, amdgpu_xcp_2); chat-2 on the whole GPU at 0000:0d:00.0 (5 %)."""
    config = tmp_path / "amd.txt"
    lines, render_nodes = fakeamdsmi.partitioned_gpu(0, gfx=10, busy=(63, 0, 0, 21),
                                                     vram_used=1024)
    config.write_text("\n".join([
        *lines, fakeamdsmi.gpu_line(8, gfx=5),
        fakeamdsmi.proc_line(0, 8001, name="python3", vram=2**30),
        fakeamdsmi.proc_line(3, 8002, name="python3", vram=2**30),
        fakeamdsmi.proc_line(8, 8003, name="python3", vram=2**30)]) + "\n")
    sys_root = drm_tree(tmp_path / "sys", {**render_nodes, 136: "0000:0d:00.0"})
    root = fakeamdsmi.build()
    os.environ["FAKEAMDSMI_CONFIG"] = str(config)  # read by the library at each init

    def load() -> ModuleType:  # the real package, finding the fake as on a node
        os.environ["ROCM_PATH"] = str(root)
        return _load_amdsmi()

    held = [("amd.com/cpx_nps1", fakeamdsmi.xcp_name(0, 0)),
            ("amd.com/cpx_nps1", fakeamdsmi.xcp_name(0, 3)), ("amd.com/gpu", "0000:0d:00.0")]
    kubelet.pods = [pod("llm", f"chat-{i}", ("engine", resource, [device]))
                    for i, (resource, device) in enumerate(held)]
    for i in range(3):
        kubeapi.add(make_pod("llm", f"chat-{i}", _uid(i), node=AMD_NODE,
                             containers=(("engine", _cid(i)),), labels={"app": "chat"}))
    proc = tmp_path / "proc"
    for i in range(3):
        (proc / str(8001 + i)).mkdir(parents=True)
        (proc / str(8001 + i) / "cgroup").write_text(
            f"0::/kubepods/besteffort/pod{_uid(i)}/{_cid(i)}\n")
    api = api_client(kubeapi)
    sources = ClusterSources(PodResourcesClient(kubelet.socket_path, timeout=1.0),
                             NodePodCache(api, AMD_NODE, backoff_s=(0.05,)),
                             PidResolver(proc), api=api)
    agent = Agent(AmdSmiBackend(AMD_NODE, load=load, sys_root=sys_root),
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
        amd_agent: tuple[Agent, Path], tmp_path: Path) -> None:
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
    service = ScalerService(Answers(fleet, roster=AgentRoster(sub)))
    inspector = Inspector(Recorder(service.answers, service.history))
    server = ScalerServer(service, host="127.0.0.1", port=0,
                          extra=[(SERVICE, lambda s: add_to_server(inspector, s))])
    await server.start()
    access = LocalAccess.create(tmp_path / "metrics-api")
    metrics_api = MetricsApiServer(MetricAnswers(service.answers, None), None, None,
                                   access.cert, access.key, "127.0.0.1", 0, local=access)
    listening: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    api_task = asyncio.create_task(metrics_api.serve(listening.set_result))
    api_port = await listening
    tls = ssl.create_default_context(cafile=str(access.ca))
    http = aiohttp.ClientSession(headers={"Authorization": f"Bearer {access.token}"})

    async def custom_metric(app: str) -> Any:
        url = (f"https://127.0.0.1:{api_port}/apis/custom.metrics.k8s.io/v1beta1/"
               f"namespaces/llm/pods/*/gpu_utilization?labelSelector=app%3D{app}")
        async with http.get(url, ssl=tls) as resp:
            body = await resp.json()
            return body if resp.status == 200 else f"{resp.status}: {body.get('message')}"

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
        inspect = ipb_grpc.InspectStub(channel)
        try:
            # AMD: each pod its own partition's busy share, plus the whole GPU's:
            # 63 + 21 + 5 (the partitions' GPU averages 10: 10 + 10 + 5 were too small).
            assert await until(lambda: _equals(value("chat"), 89.0), 15.0,
                               "the AMD workload's value")
            # NVIDIA MIG: the Triton pods on their MIG slices, from the same scaler.
            triton = await until(lambda: _number(value("triton-embed")), 15.0,
                                 "the MIG workload's value")
            assert triton > 0
            # The plain-HPA path: the custom metrics API gives each pod its own value.
            listed = await custom_metric("chat")
            assert {i["describedObject"]["name"]: i["value"] for i in listed["items"]} == {
                "chat-0": "63", "chat-1": "21", "chat-2": "5"}
            assert (await custom_metric("triton-embed"))["items"]
            # Explain: which partition of which GPU each pod holds.
            why = await inspect.Explain(ipb.ExplainRequest(namespace="llm", name="chat"))
            assert {p.name: list(p.gpus) for p in why.pods} == {
                "chat-0": ["partition cpx.nps1 on GPU 0"],
                "chat-1": ["partition cpx.nps1 on GPU 0"], "chat-2": ["GPU 1"]}
            assert why.answers[0].value == 89.0
            # Partition 3 of the AMD GPU is lost: its pod's reading is lost, so the
            # workload is UNAVAILABLE on both paths - never the 68 of what is left.
            config.write_text(config.read_text().replace(
                "gpu idx=3 ", "gpu idx=3 lost=1 "))  # (the fake reads it again)
            got = await until(lambda: _unavailable(value("chat")), 15.0,
                              "the AMD workload UNAVAILABLE")
            assert "chat-1" in str(got)
            refused = await custom_metric("chat")
            assert str(refused).startswith("503"), refused
        finally:
            await http.close()
            api_task.cancel()
            await asyncio.gather(api_task, return_exceptions=True)
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
