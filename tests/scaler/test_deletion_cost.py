"""Take the idlest replica (``--pod-deletion-cost``): a planned workload's plan below its
Ready pods annotates them with their requests in flight, through our API client against
the API-server peer (JSON merge patch, as the real server applies one)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest

from gpuscale.kube.api import KubeApi
from gpuscale.kube.errors import ApiError
from gpuscale.scaler.answers import Answers, Workload
from gpuscale.scaler.core.trigger import parse_metadata
from gpuscale.scaler.edges.deletion_cost import ANNOTATION, UNKNOWN_COST, DeletionCosts, cost
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.stream.records import PodRecord
from gpuscale.telemetry.model import Absent, Reading
from tests.peers.kubeapi import KubeApiPeer, api_client, make_pod
from tests.support.clock import Clock
from tests.support.vllm import vllm_pod

METADATA = {"podSelector": "app=vllm", "profile": "vllm-planner", "targetValue": "10",
            "queueDelaySeconds": "2", "startupSeconds": "60",
            "prefillTokensPerSecond": "30000", "decodeTokensPerSecond": "12000"}
IN_FLIGHT = {"v-0": (7.0, 0.0), "v-1": (0.0, 0.0), "v-2": (3.0, 0.0), "v-3": (2.5, 0.0)}


@pytest.fixture
async def api(kubeapi: KubeApiPeer) -> AsyncIterator[KubeApi]:
    client = api_client(kubeapi)
    yield client
    await client.close()


def pods(at: float, override: dict[str, dict[str, Reading]] | None = None
         ) -> list[PodRecord]:
    """Four lightly loaded vLLM pods, each with its running and waiting requests."""
    return [vllm_pod(name, 0.2, at=at, override={"vllm-running": run, "vllm-waiting": wait,
                                                  **(override or {}).get(name, {})})
            for name, (run, wait) in IN_FLIGHT.items()]


def add_pods(peer: KubeApiPeer) -> None:
    for i, name in enumerate(IN_FLIGHT):
        pod = make_pod("llm", name, f"uid-{i}", labels={"app": "vllm"})
        pod["metadata"]["annotations"] = {"team": "chat"}
        peer.add(pod)


def annotations_of(peer: KubeApiPeer) -> dict[str, dict[str, str]]:
    return {p["metadata"]["name"]: p["metadata"].get("annotations", {})
            for p in peer.pods.values()}


async def test_a_planned_scale_down_annotates_each_pod_with_its_requests_in_flight(
        kubeapi: KubeApiPeer, api: KubeApi, fleet: FleetView, clock: Clock) -> None:
    add_pods(kubeapi)
    answers = Answers(fleet)
    workload = Workload("llm", "chat", parse_metadata(METADATA))
    for _ in range(70):  # past the hold (the start-up, 60 s): 0.8 replica-seconds of work
        fleet.update_node("node-a", pods(clock.now))
        answers.value(workload, workload.trigger.targets[0])
        answers.plans.tick(clock.now)
        clock.now += 1
    ((plan, held),) = answers.scale_downs()
    assert plan.replicas < plan.ready == 4
    assert {p.name for p in held} == set(IN_FLIGHT)  # the pods it observed last
    costs = DeletionCosts(rate=1000.0)
    queued = pods(clock.now, {"v-0": {"vllm-waiting": 1.0}})  # one request queued at v-0
    await costs.write(api, [(plan, queued)])
    got = annotations_of(kubeapi)
    # running + waiting, rounded up; the pods' other annotations kept (a merge patch)
    assert {n: a[ANNOTATION] for n, a in got.items()} == {
        "v-0": "8", "v-1": "0", "v-2": "3", "v-3": "3"}
    assert all(a["team"] == "chat" for a in got.values())
    # Unchanged costs are not written again; a changed one is.
    written = len(kubeapi.patches)
    await costs.write(api, [(plan, queued)])
    assert len(kubeapi.patches) == written
    busier = pods(clock.now, {"v-0": {"vllm-waiting": 1.0}, "v-1": {"vllm-running": 12.0}})
    await costs.write(api, [(plan, busier)])
    assert len(kubeapi.patches) == written + 1
    assert annotations_of(kubeapi)["v-1"][ANNOTATION] == "12"


async def test_no_scale_down_pending_writes_nothing(kubeapi: KubeApiPeer, api: KubeApi,
                                                   fleet: FleetView, clock: Clock) -> None:
    add_pods(kubeapi)
    answers = Answers(fleet)
    workload = Workload("llm", "chat", parse_metadata(METADATA))
    for _ in range(70):  # busy enough for all four
        fleet.update_node("node-a", [vllm_pod(n, 0.9, at=clock.now) for n in IN_FLIGHT])
        answers.value(workload, workload.trigger.targets[0])
        answers.plans.tick(clock.now)
        clock.now += 1
    assert answers.scale_downs() == []
    await DeletionCosts(rate=1000.0).write(api, answers.scale_downs())
    assert kubeapi.patches == []


def test_a_pod_whose_load_is_unknown_goes_last() -> None:
    unknowns: list[dict[str, Reading]] = [{"vllm-running": Absent.NO_DATA},
                                          {"vllm-waiting": float("nan")},
                                          {"vllm-running": -1.0}]
    for missing in unknowns:
        assert cost(vllm_pod("v", 0.2, at=0.0, override=missing)) == UNKNOWN_COST
    assert cost(vllm_pod("v", 0.2, at=0.0, override={"vllm-running": 1e12})) == \
        UNKNOWN_COST - 1  # a huge number stays below "unknown"


async def test_refusals_are_said_once_and_a_pod_gone_is_skipped(
        kubeapi: KubeApiPeer, api: KubeApi, fleet: FleetView, clock: Clock,
        caplog: pytest.LogCaptureFixture) -> None:
    add_pods(kubeapi)
    del kubeapi.pods["uid-3"]  # v-3 went between the observation and the write
    costs = DeletionCosts(rate=1000.0)
    answers = Answers(fleet)
    workload = Workload("llm", "chat", parse_metadata(METADATA))
    for _ in range(70):
        fleet.update_node("node-a", pods(clock.now))
        answers.value(workload, workload.trigger.targets[0])
        answers.plans.tick(clock.now)
        clock.now += 1
    pending = answers.scale_downs()
    await costs.write(api, pending)
    assert "v-3" not in annotations_of(kubeapi)
    assert {n for n, a in annotations_of(kubeapi).items() if ANNOTATION in a} == {
        "v-0", "v-1", "v-2"}
    # No RBAC for patch on pods: one warning naming what to grant, however many passes.
    kubeapi.forbidden.add("/api/v1/namespaces/llm/pods/")
    fresh = DeletionCosts(rate=1000.0)
    with caplog.at_level(logging.WARNING, "gpuscale.scaler.edges.deletion_cost"):
        for _ in range(3):
            await fresh.write(api, pending)
    warnings = [r for r in caplog.records if "patch on pods" in r.getMessage()]
    assert len(warnings) == 1
    assert "scaler.podDeletionCost" in warnings[0].getMessage()


async def test_the_client_merges_annotations_and_names_what_failed(
        kubeapi: KubeApiPeer, api: KubeApi) -> None:
    add_pods(kubeapi)
    got = await api.annotate_pod("llm", "v-0", {ANNOTATION: "5"})
    assert got["metadata"]["annotations"] == {"team": "chat", ANNOTATION: "5"}
    with pytest.raises(ApiError) as err:
        await api.annotate_pod("llm", "nobody", {ANNOTATION: "1"})
    assert err.value.status == 404
    assert "PATCH /api/v1/namespaces/llm/pods/nobody" in str(err.value)
    with pytest.raises(ApiError, match="cannot be an object name"):
        await api.annotate_pod("llm", "../x", {ANNOTATION: "1"})
