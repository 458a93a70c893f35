"""The planner behind the ExternalScaler, over real gRPC: the metric spec, the value KEDA
gets, ticking, and UNAVAILABLE when the engines' counters are missing."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator

import grpc
import pytest

from gpuscale.proto import externalscaler_pb2 as pb
from gpuscale.proto import externalscaler_pb2_grpc as pb_grpc
from gpuscale.scaler.answers import Answers
from gpuscale.scaler.edges.keda import ScalerServer, ScalerService
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.stream.records import PodRecord
from gpuscale.telemetry.model import Absent, Reading
from tests.support.clock import Clock
from tests.support.polling import until
from tests.support.vllm import vllm_pod

Served = tuple[ScalerService, pb_grpc.ExternalScalerStub]
METADATA = {"podSelector": "app=vllm", "profile": "vllm-planner", "targetValue": "10",
            "queueDelaySeconds": "2", "startupSeconds": "120",
            "prefillTokensPerSecond": "30000", "decodeTokensPerSecond": "12000"}


def pod(name: str, busy: float, *, at: float, ready: bool = True, waiting: float = 0.0,
        override: dict[str, Reading] | None = None) -> PodRecord:
    return vllm_pod(name, busy, at=at, ready=ready, waiting=waiting, override=override)


@pytest.fixture
async def served(fleet: FleetView) -> AsyncIterator[Served]:
    service = ScalerService(Answers(fleet))
    server = ScalerServer(service, host="127.0.0.1", port=0)
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    yield service, pb_grpc.ExternalScalerStub(channel)
    await channel.close()
    await server.stop(0.5)


def ref() -> pb.ScaledObjectRef:
    return pb.ScaledObjectRef(name="chat", namespace="llm", scalerMetadata=METADATA)


async def value(stub: pb_grpc.ExternalScalerStub) -> float:
    got = await stub.GetMetrics(pb.GetMetricsRequest(
        scaledObjectRef=ref(), metricName="s0-gpuscale-planned-replicas"), timeout=5)
    return float(got.metricValues[0].metricValueFloat)


async def test_spec_and_value_are_planned_replicas_times_the_target(
        served: Served, fleet: FleetView, clock: Clock) -> None:
    service, stub = served
    spec = await stub.GetMetricSpec(ref(), timeout=5)
    assert [(m.metricName, m.targetSizeFloat) for m in spec.metricSpecs] == [
        ("gpuscale-planned-replicas", 10.0)]
    for _ in range(130):  # longer than the hold (the start-up time, 120 s)
        fleet.update_node("node-a", [pod("v-0", 1.2, at=clock.now),
                                     pod("v-1", 1.2, at=clock.now)])
        if len(service.plans):
            service.plans.tick(clock.now)
        else:
            await value(stub)  # the first ask creates the planner
        clock.now += 1
    clock.now -= 1
    # 2.4 replica-seconds per second with the room of utilization 0.85 (the default;
    # past 2 replicas' work, (1 / 0.85 - 1) x sqrt(2 x 2.4)): 2.79, 3 replicas.
    assert await value(stub) == 30.0
    assert (await stub.IsActive(ref(), timeout=5)).result
    plans = dict(service.plans.plans())
    assert plans[("llm", "chat")].steady == pytest.approx(
        2.4 + (1 / 0.85 - 1) * math.sqrt(2 * 2.4))


async def test_a_ready_pod_without_counters_is_unavailable_naming_it(
        served: Served, fleet: FleetView, clock: Clock) -> None:
    service, stub = served
    fleet.update_node("node-a", [pod("v-0", 1.0, at=clock.now),
                                 pod("v-1", 1.0, at=clock.now,
                                     override={"vllm-prompt-tps": Absent.NO_DATA})])
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await value(stub)
    assert err.value.code() is grpc.StatusCode.UNAVAILABLE
    assert "llm/chat: planner: no plan yet" in (err.value.details() or "")
    assert "llm/v-1" in (err.value.details() or "")
    # A plan made, then the counters go missing: the plan holds for its staleness bound,
    # then the answer is UNAVAILABLE with the reason, never a smaller count.
    fleet.update_node("node-a", [pod("v-0", 1.0, at=clock.now),
                                 pod("v-1", 1.0, at=clock.now)])
    service.plans.tick(clock.now)
    assert await value(stub) >= 20.0  # two pods exist: warming up, never below them
    fleet.update_node("node-a", [pod("v-0", 1.0, at=clock.now),
                                 pod("v-1", 1.0, at=clock.now,
                                     override={"vllm-generation-tps": Absent.UNAVAILABLE})])
    for _ in range(11):
        clock.now += 1
        service.plans.tick(clock.now)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await value(stub)
    assert err.value.code() is grpc.StatusCode.UNAVAILABLE
    assert "no usable observation for 11s" in (err.value.details() or "")


async def test_starting_pods_are_part_of_the_plan_not_added_to_it(
        served: Served, fleet: FleetView, clock: Clock) -> None:
    service, stub = served
    fleet.update_node("node-a", [pod("v-0", 0.4, at=clock.now),
                                 pod("v-1", 0.0, at=clock.now, ready=False),
                                 pod("v-2", 0.0, at=clock.now, ready=False)])
    await value(stub)
    plan = dict(service.plans.plans())[("llm", "chat")]
    assert (plan.ready, plan.starting, plan.replicas) == (1, 2, 3)


async def test_the_plan_loop_ticks_until_the_service_stops(
        served: Served, fleet: FleetView, clock: Clock) -> None:
    service, stub = served
    fleet.update_node("node-a", [pod("v-0", 0.4, at=clock.now)])
    await value(stub)
    planner_at = dict(service.plans.plans())[("llm", "chat")].at
    clock.now += 1
    fleet.update_node("node-a", [pod("v-0", 0.4, at=clock.now)])
    service.stopping.clear()
    task = asyncio.create_task(service.plans.run(fleet.now, service.stopping, period=0.01))
    await until(lambda: dict(service.plans.plans())[("llm", "chat")].at > planner_at,
                what="a tick")
    service.stopping.set()
    await asyncio.wait_for(task, 5)
