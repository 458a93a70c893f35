"""The ``cluster`` fixture of the metrics API server tests: the server on loopback HTTPS
with the test API server behind it (its trust ConfigMap, review policy, pods and workloads)
and a fleet recorded on the hand-moved clock: data recorded once stays fresh, a review
stays cached, however slowly the machine serves; staleness is a test's own step."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpuscale.metrics_api.answers import MetricAnswers
from gpuscale.metrics_api.authz import Authorizer
from gpuscale.metrics_api.main import configmap_reader
from gpuscale.metrics_api.server import MetricsApiServer, TrustSource
from gpuscale.scaler.answers import Answers
from gpuscale.scaler.sources.roster import AgentRoster, PodRoster
from gpuscale.scaler.sources.workloads import WorkloadResolver
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.scaler.state.plan_book import PlanBook
from gpuscale.stream.subscriber import AgentSubscriber
from tests.metrics_api.https_cluster import Cluster, gpu_pod, policy, record, write_certs
from tests.peers.kubeapi import DEPLOYMENTS, STATEFULSETS, KubeApiPeer, api_client, make_workload
from tests.support.clock import Clock
from tests.support.kubeconfig import write_kubeconfig
from tests.support.polling import until


@pytest.fixture
async def cluster(tmp_path: Path, kubeapi: KubeApiPeer,
                  clock: Clock) -> AsyncIterator[Cluster]:
    kubeapi.set_configmap("kube-system", "extension-apiserver-authentication",
                          write_certs(tmp_path))
    kubeapi.authorize = policy
    for name in ("vllm-0", "vllm-1"):
        kubeapi.add(gpu_pod(name))
    kubeapi.add(gpu_pod("vllm-2", ready=False))
    kubeapi.add(make_workload("Deployment", "llm", "vllm", {"app": "vllm"}), DEPLOYMENTS)
    kubeapi.add(make_workload("StatefulSet", "llm", "trainer", {"app": "trainer"}),
                STATEFULSETS)
    for name in ("triton-0", "triton-1"):
        kubeapi.add(gpu_pod(name, "triton", ns="infer"))
    kubeapi.add(make_workload("Deployment", "infer", "triton", {"app": "triton"}),
                DEPLOYMENTS)
    fleet = FleetView(monotonic=clock)
    fleet.update_node("node-a", [
        record(fleet, "vllm-0", gpu_utilization=73.25, vllm_waiting=4, vllm_kv_cache=42.0,
               gpu_memory_used=70000.0, vllm_requests=40),
        record(fleet, "vllm-1", gpu_utilization=10.0, vllm_waiting=0, vllm_kv_cache=3.0,
               gpu_memory_used=69000.5, vllm_requests=20),
        record(fleet, "triton-0", "triton", ns="infer", triton_queue_time=0.04),
        record(fleet, "triton-1", "triton", ns="infer", triton_queue_time=0.09)])
    api = api_client(kubeapi)
    sub = AgentSubscriber(fleet, "test")
    roster = PodRoster(api, AgentRoster(sub), backoff_s=(0.05,))
    resolver = WorkloadResolver(api, backoff_s=(0.05,))
    server = MetricsApiServer(
        MetricAnswers(Answers(fleet, roster=roster, plans=PlanBook()), resolver),
        Authorizer(api, monotonic=clock), TrustSource(configmap_reader(api)),
        tmp_path / "serving.crt", tmp_path / "serving.key", "127.0.0.1", 0)
    bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    tasks = [asyncio.create_task(t) for t in (roster.run(), resolver.run(),
                                              server.serve(bound.set_result))]
    port = await asyncio.wait_for(bound, 10)
    await until(lambda: roster.ready()[0], what="the pod roster listed the pods")
    write_kubeconfig(tmp_path / "kubeconfig", f"https://127.0.0.1:{port}",
                     {"client-certificate": str(tmp_path / "hpa.crt"),
                      "client-key": str(tmp_path / "hpa.key")}, tmp_path / "serving-ca.crt")
    yield Cluster(server, kubeapi, fleet, tmp_path, f"https://127.0.0.1:{port}")
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await sub.close()
    await api.close()
