"""One answer: what KEDA gets (GetMetrics over gRPC), what ``gpuscale explain`` shows (the
Inspect service over gRPC) and what the custom metrics API serves are the same number, or
the same UNAVAILABLE reason, at the same instant - all three through scaler.answers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest

from gpuscale.common.errors import DataUnavailable, Unavailable
from gpuscale.metrics_api.answers import MetricAnswers
from gpuscale.proto import externalscaler_pb2 as pb
from gpuscale.proto import externalscaler_pb2_grpc as pb_grpc
from gpuscale.proto import inspect_pb2 as ipb
from gpuscale.proto import inspect_pb2_grpc as ipb_grpc
from gpuscale.scaler.config import ScalerConfig
from gpuscale.scaler.core.selector import Selector, parse_selector
from gpuscale.scaler.root import Scaler
from gpuscale.stream.records import PodRecord
from gpuscale.telemetry.model import Absent, Reading

UTILIZATION = {"podSelector": "app=vllm", "profile": "gpu-utilization"}
PLANNED = {"podSelector": "app=vllm", "profile": "vllm-planner"}


class Deployments:
    """The metrics API's view of the workloads: Deployment vllm selects app=vllm."""

    def target(self, namespace: str, kind: str, name: str) -> Selector | Unavailable | None:
        return parse_selector("app=vllm") if (kind, name) == ("Deployment", "vllm") else None


@dataclass
class Peers:
    scaler: Scaler
    keda: pb_grpc.ExternalScalerStub
    inspect: ipb_grpc.InspectStub
    metrics_api: MetricAnswers

    def feed(self, utilization: list[Reading]) -> None:
        now = self.scaler.fleet.now()
        self.scaler.fleet.update_node("node-a", [
            PodRecord("llm", f"vllm-{i}", "node-a", {"app": "vllm"}, None, True, {
                "gpu-utilization": u, "vllm-prompt-tps": 3000.0,
                "vllm-generation-tps": 1200.0, "vllm-finished-rate": 2.0,
                "vllm-waiting": 1.0, "vllm-running": 8.0, "vllm-kv-cache": 30.0}, now)
            for i, u in enumerate(utilization)])

    async def keda_value(self, metadata: dict[str, str], metric: str) -> float | str:
        """GetMetrics' value, or its UNAVAILABLE message."""
        try:
            got = await self.keda.GetMetrics(pb.GetMetricsRequest(
                scaledObjectRef=pb.ScaledObjectRef(namespace="llm", name="chat",
                                                   scalerMetadata=metadata),
                metricName=metric), timeout=5)
        except grpc.aio.AioRpcError as exc:
            if exc.code() is not grpc.StatusCode.UNAVAILABLE:
                raise
            return exc.details() or ""
        return float(got.metricValues[0].metricValueFloat)

    async def explained(self) -> ipb.ExplainReply:
        reply: ipb.ExplainReply = await self.inspect.Explain(
            ipb.ExplainRequest(namespace="llm", name="chat"), timeout=5)
        return reply


@pytest.fixture
async def peers() -> AsyncIterator[Peers]:
    scaler = Scaler(ScalerConfig(host="127.0.0.1", port=0, metrics_port=None,
                                 in_process=True))
    up = asyncio.Event()
    task = asyncio.create_task(scaler.run(lambda _: up.set()))
    await asyncio.wait_for(up.wait(), 10)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{scaler.port}") as channel:
        yield Peers(scaler, pb_grpc.ExternalScalerStub(channel), ipb_grpc.InspectStub(channel),
                    MetricAnswers(scaler.answers, Deployments()))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_keda_explain_and_the_metrics_api_give_one_value(peers: Peers) -> None:
    peers.feed([40.0, 55.5, 70.25])
    keda = await peers.keda_value(UTILIZATION, "s0-gpuscale-gpu-utilization")
    explained = (await peers.explained()).answers[0]
    served = peers.metrics_api.object("llm", "deployments.apps", "vllm",
                                      "gpuscale_gpu_utilization")
    assert keda == pytest.approx(165.75)  # the sum over the pods (AverageValue)
    assert (explained.value, explained.unavailable, explained.counted) == (keda, "", 3)
    assert served.value == keda


async def test_they_give_one_reason_when_a_pod_has_no_reading(peers: Peers) -> None:
    peers.feed([40.0, Absent.LOST, 70.0])
    keda = await peers.keda_value(UTILIZATION, "s0-gpuscale-gpu-utilization")
    explained = (await peers.explained()).answers[0]
    with pytest.raises(DataUnavailable) as served:
        peers.metrics_api.object("llm", "deployments.apps", "vllm", "gpuscale_gpu_utilization")
    reason = "1 of 3 pods have no usable gpu-utilization: llm/vllm-1 (lost)"
    assert keda == f"llm/chat: {reason}"  # KEDA's message names the ScaledObject
    assert explained.unavailable == str(served.value) == reason


async def test_the_planner_keda_asks_is_the_one_explain_reads(peers: Peers) -> None:
    peers.feed([50.0, 50.0])
    keda = await peers.keda_value(PLANNED, "s0-gpuscale-planned-replicas")
    reply = await peers.explained()
    assert isinstance(keda, float)
    assert keda >= 1
    assert reply.answers[0].value == keda
    assert reply.planned_replicas == keda
    assert reply.plan_terms  # the terms that made it
    assert len(peers.scaler.plans) == 1  # explain read it; it created no planner
