"""The scaler knows which agents and pods must have reported before it answers OK: real
agents over real gRPC streams, the subscriber, the roster and the ExternalScaler."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscale.common.errors import Unavailable
from gpuscale.proto import externalscaler_pb2 as pb
from gpuscale.proto import externalscaler_pb2_grpc as pb_grpc
from gpuscale.scaler.answers import Answers, Workload
from gpuscale.scaler.core.selector import parse_selector
from gpuscale.scaler.core.trigger import parse_metadata
from gpuscale.scaler.edges.keda import ScalerServer, ScalerService
from gpuscale.scaler.sources.roster import AgentRoster, PodRoster, running_pod
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.stream.subscriber import AgentSubscriber
from gpuscale.telemetry.scenario import NodeSpec, parse_scenario
from tests.peers.kubeapi import KubeApiPeer, api_client, make_pod
from tests.support.agents import running_agents
from tests.support.clock import Clock
from tests.support.polling import until
from tests.support.ports import free_port
from tests.support.vllm import vllm_pod


def node(name: str, pod: str, load: float) -> NodeSpec:
    return parse_scenario({"nodes": [{"name": name, "gpus": [{"model": "L4"}], "processes": [
        {"gpu": 0, "memory_mib": 100, "load": {"constant": load},
         "pod": {"namespace": "llm", "name": pod, "container": "c"}}]}]}).nodes[0]


def ref(app: str) -> pb.ScaledObjectRef:
    return pb.ScaledObjectRef(name=app, namespace="llm",
                              scalerMetadata={"podSelector": f"app={app}"})


def metrics(app: str) -> pb.GetMetricsRequest:
    return pb.GetMetricsRequest(scaledObjectRef=ref(app),
                                metricName="s0-gpuscale-gpu-utilization")


async def value(stub: pb_grpc.ExternalScalerStub, app: str) -> float | str:
    """GetMetrics' value, or the failed status as 'CODE: details'."""
    try:
        return float((await stub.GetMetrics(metrics(app), timeout=5)).metricValues[0]
                     .metricValueFloat)
    except grpc.aio.AioRpcError as exc:
        return f"{exc.code().name}: {exc.details()}"


@pytest.fixture
async def scaler() -> AsyncIterator[tuple[AgentSubscriber, AgentRoster, Any]]:
    fleet = FleetView()
    sub = AgentSubscriber(fleet, "test", backoff_s=(0.05,))
    roster = AgentRoster(sub)
    server = ScalerServer(ScalerService(Answers(fleet, roster=roster)), host="127.0.0.1", port=0)
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    yield sub, roster, pb_grpc.ExternalScalerStub(channel)
    await channel.close()
    await server.stop(0.2)
    await sub.close()


async def test_a_configured_agent_that_never_reported_holds_every_answer(
        scaler: tuple[AgentSubscriber, AgentRoster, Any]) -> None:
    """Static addresses: a workload that lives only on the silent agent's node would read
    0 (and IsActive false) from a partial fleet view; it is UNAVAILABLE instead, and so is
    every other workload, since any of them may have pods there."""
    sub, roster, stub = scaler
    late_port = free_port()
    async with running_agents([node("n-a", "a-0", 40.0)]) as (a,):
        sub.set_addresses([f"127.0.0.1:{a.stream_port}", f"127.0.0.1:{late_port}"])
        await until(lambda: roster.ready()[1].startswith("waiting for 1 of 2"),
                    what="the first agent reported")
        got = await value(stub, "a")
        assert isinstance(got, str)
        assert got.startswith("UNAVAILABLE: llm/a: not every pod of the workload has "
                              f"reported: agent 127.0.0.1:{late_port} has not reported (not "
                              f"connected")
        assert "its node's pods are unknown" in got
        code, _ = await _code(stub.IsActive(ref("b")))
        assert code is grpc.StatusCode.UNAVAILABLE
        ready, line = roster.ready()
        assert not ready
        assert f"waiting for 1 of 2 agents: 127.0.0.1:{late_port}" == line
        async with running_agents([node("n-b", "b-0", 30.0)], stream_ports=[late_port]):
            assert await until(lambda: _equals(value(stub, "b"), 30.0), what="b's value")
            assert await value(stub, "a") == 40.0
            assert (await stub.IsActive(ref("b"))).result is True
            assert roster.ready() == (True, "2 agents reporting")


async def test_two_agents_claiming_one_node_are_not_merged(
        scaler: tuple[AgentSubscriber, AgentRoster, Any]) -> None:
    """Two simulated agents on one host both call themselves 'dup': their pods used to be
    merged under one node, each update replacing the other's."""
    sub, _, stub = scaler
    async with running_agents([node("dup", "a-0", 40.0), node("dup", "a-1", 30.0)]) as ags:
        addrs = sorted(f"127.0.0.1:{a.stream_port}" for a in ags)
        sub.set_addresses(addrs)
        claimed = f"node dup is claimed by agents {addrs[0]} and {addrs[1]}"
        await until(lambda: _says(value(stub, "a"), claimed), what="the claim named")
        # Discovery knows better: the endpoints run on two nodes, whatever the agents say.
        sub.set_addresses({f"127.0.0.1:{ags[0].stream_port}": "gpu-1",
                           f"127.0.0.1:{ags[1].stream_port}": "gpu-2"})
        assert await until(lambda: _equals(value(stub, "a"), 70.0), what="both pods summed")
        placed = {r.name: r.node for r in fleet_of(sub).select("llm", parse_selector("app=a"))}
        assert placed == {"a-0": "gpu-1", "a-1": "gpu-2"}
        # Two endpoints on one node (two agents there): UNAVAILABLE, naming both.
        sub.set_addresses(dict.fromkeys(addrs, "gpu-1"))
        claimed = f"node gpu-1 is claimed by agents {addrs[0]} and {addrs[1]}"
        await until(lambda: _says(value(stub, "a"), claimed), what="both endpoints named")


def fleet_of(sub: AgentSubscriber) -> FleetView:
    assert isinstance(sub.sink, FleetView)
    return sub.sink


async def _code(call: Any) -> tuple[grpc.StatusCode, str]:
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


async def _says(got: Any, text: str) -> bool:
    answer = await got
    return isinstance(answer, str) and answer.startswith("UNAVAILABLE") and text in answer


async def _equals(got: Any, want: float) -> bool:
    return bool(await got == want)


def gpu_pod(name: str, node_name: str, *, ready: bool = True, gpus: bool = True,
            phase: str = "Running") -> dict[str, Any]:
    raw = make_pod("llm", name, f"uid-{name}", node=node_name, ready=ready, phase=phase,
                   labels={"app": name.rsplit("-", 1)[0]})
    limits = {"nvidia.com/gpu": "1"} if gpus else {"cpu": "1"}
    raw["spec"]["containers"] = [{"name": "main", "resources": {"limits": limits}}]
    return raw


async def test_with_the_api_every_ready_gpu_pod_must_have_reported(
        kubeapi: KubeApiPeer) -> None:
    """A running, Ready GPU pod on a node whose agent is gone (forgotten, never deployed,
    not ready in discovery) used to leave the sum silently; the pod watch names it."""
    fleet = FleetView()
    sub = AgentSubscriber(fleet, "test", backoff_s=(0.05,))
    api = api_client(kubeapi)
    roster = PodRoster(api, AgentRoster(sub), backoff_s=(0.05,))
    watch = asyncio.create_task(roster.run())
    server = ScalerServer(ScalerService(Answers(fleet, roster=roster)), host="127.0.0.1", port=0)
    await server.start()
    kubeapi.add(gpu_pod("a-0", "n-a"))
    kubeapi.add(gpu_pod("a-1", "n-b"))  # runs where no agent reports
    kubeapi.add(gpu_pod("a-2", "n-b", ready=False))  # starting: no load yet
    kubeapi.add(gpu_pod("a-3", "n-b", gpus=False))  # a sidecar-ish pod without GPUs
    try:
        async with running_agents([node("n-a", "a-0", 40.0)]) as (a,), \
                grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.ExternalScalerStub(channel)
            sub.set_addresses({f"127.0.0.1:{a.stream_port}": "n-a"})
            await until(lambda: _says(value(stub, "a"), "llm/a-1 on n-b (running and "
                                      "Ready, no data: no agent reports for node n-b)"),
                        what="the silent pod named")
            got = await value(stub, "a")
            assert "a-2" not in str(got)
            assert "a-3" not in str(got)
            assert roster.ready()[0]
            # The pod finishes: it leaves the watch's phase selector (a DELETED event).
            kubeapi.modify(gpu_pod("a-1", "n-b", phase="Succeeded"))
            assert await until(lambda: _equals(value(stub, "a"), 40.0), what="OK again")
    finally:
        watch.cancel()  # and awaited before the client closes: closing httpx2's pool while
        await asyncio.gather(watch, return_exceptions=True)  # a stream unwinds can hang
        await server.stop(0.2)
        await sub.close()
        await api.close()


async def test_a_pod_watch_down_too_long_holds_every_answer(kubeapi: KubeApiPeer) -> None:
    """The last listed pods stand in while the watch is down, but not for ever: a pod that
    became Ready since could be silent too."""
    fleet = FleetView()
    sub = AgentSubscriber(fleet, "test", backoff_s=(0.05,))
    api = api_client(kubeapi)
    roster = PodRoster(api, AgentRoster(sub), backoff_s=(0.05,), list_stale_after=0.3)
    watch = asyncio.create_task(roster.run())
    kubeapi.add(gpu_pod("a-0", "n-a"))
    try:
        async with running_agents([node("n-a", "a-0", 40.0)]) as (a,):
            sub.set_addresses({f"127.0.0.1:{a.stream_port}": "n-a"})
            sel = parse_selector("app=a")
            await until(lambda: roster.problems("llm", sel, fleet.select("llm", sel)) == [],
                        what="no gaps")
            good, kubeapi.token = kubeapi.token, "rotated"  # the scaler's token is refused
            await kubeapi.drop_watches()
            gaps = await until(lambda: roster.problems("llm", sel, fleet.select("llm", sel)),
                               what="a gap while the watch is down")
            assert gaps[0].startswith("the running pods are not known: the pod watch has "
                                      "been down for")
            assert "unauthorized (401)" in gaps[0]
            assert not roster.ready()[0]
            kubeapi.token = good
            await until(lambda: roster.problems("llm", sel, fleet.select("llm", sel)) == [],
                        what="no gaps once the watch is back")
    finally:
        watch.cancel()  # and awaited before the client closes: closing httpx2's pool while
        await asyncio.gather(watch, return_exceptions=True)  # a stream unwinds can hang
        await sub.close()
        await api.close()


async def test_the_planner_does_not_plan_from_a_partial_fleet(
        scaler: tuple[AgentSubscriber, AgentRoster, Any]) -> None:
    """A vllm-planner trigger whose pods may sit on a configured agent that never reported
    would plan 0 replicas from an empty view; it is UNAVAILABLE, naming the agent."""
    sub, _, stub = scaler
    silent = free_port()
    sub.set_addresses([f"127.0.0.1:{silent}"])
    planner = pb.ScaledObjectRef(name="chat", namespace="llm", scalerMetadata={
        "podSelector": "app=chat", "profile": "vllm-planner"})
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.GetMetrics(pb.GetMetricsRequest(
            scaledObjectRef=planner, metricName="s0-gpuscale-planned-replicas"), timeout=5)
    assert err.value.code() is grpc.StatusCode.UNAVAILABLE
    assert "planner: no plan yet" in (err.value.details() or "")
    assert f"127.0.0.1:{silent}" in (err.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as active:
        await stub.IsActive(planner, timeout=5)
    assert active.value.code() is grpc.StatusCode.UNAVAILABLE


def _pod_at(name: str, created: str, ready_since: str, *, restarts: int = 0,
            ready: bool = True) -> dict[str, Any]:
    raw = gpu_pod(name, "n-a", ready=ready)
    raw["metadata"]["creationTimestamp"] = created
    raw["status"]["conditions"][0]["lastTransitionTime"] = ready_since
    raw["status"]["containerStatuses"] = [{"name": "main", "ready": ready,
                                           "restartCount": restarts}]
    return raw


@pytest.mark.parametrize(("created", "ready_since", "restarts", "ready", "want"), [
    ("2026-11-26T08:00:00Z", "2026-11-26T08:02:30Z", 0, True, 150.0),
    ("2026-11-26T08:00:00+01:00", "2026-11-26T07:01:00Z", 0, True, 60.0),  # offsets
    ("2026-11-26T08:00:00Z", "2026-11-26T09:00:00Z", 1, True, None),  # restarted: later
    ("2026-11-26T08:00:00Z", "2026-11-26T08:02:30Z", 0, False, None),  # not Ready
    ("2026-11-26T08:00:00Z", "2026-11-26T07:59:00Z", 0, True, None),  # out of order
    ("2026-11-26T08:00:00", "2026-11-26T08:02:30", 0, True, None),  # no zone: unknown
    ("yesterday", "2026-11-26T08:02:30Z", 0, True, None),
    ("2026-11-26T08:00:00Z" + " " * 100, "2026-11-26T08:02:30Z", 0, True, None),
])
def test_a_pods_start_up_is_creation_to_its_first_ready(
        created: str, ready_since: str, restarts: int, ready: bool,
        want: float | None) -> None:
    assert running_pod(_pod_at("a-0", created, ready_since, restarts=restarts,
                               ready=ready)).startup_s == want


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=20), inner, max_size=3), max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(created=_JSON, ready_since=_JSON, containers=_JSON, conditions=_JSON)
def test_any_pod_json_gives_a_start_up_or_none(created: Any, ready_since: Any,
                                               containers: Any, conditions: Any) -> None:
    """Whatever the API (or something in front of it) puts in these fields, the pod is
    kept and its start-up is a positive number or unknown - never an exception."""
    raw = _pod_at("a-0", "2026-11-26T08:00:00Z", "2026-11-26T08:01:00Z")
    raw["metadata"]["creationTimestamp"] = created
    raw["status"]["conditions"][0]["lastTransitionTime"] = ready_since
    raw["status"]["containerStatuses"] = containers
    got = running_pod(raw)
    assert got.startup_s is None or got.startup_s > 0
    raw["status"]["conditions"] = conditions
    got = running_pod(raw)
    assert got.startup_s is None or got.startup_s > 0


async def test_the_planner_plans_with_the_start_ups_the_pod_watch_saw(
        kubeapi: KubeApiPeer, clock: Clock) -> None:
    """A planned trigger without startupSeconds: the planner takes the 90th percentile of
    the creation to Ready of the workload's pods the watch saw start (not Ready, then
    Ready) - not a pod that restarted, not another workload's, and not a pod already Ready
    when listed whose Ready came back after a failed probe (its last transition is the
    recovery, hours after its start)."""
    fleet = FleetView(monotonic=clock)
    api = api_client(kubeapi)
    roster = PodRoster(api, AgentRoster(AgentSubscriber(fleet, "test")), backoff_s=(0.05,))
    # Already Ready when the scaler starts, its Ready last changed at 11:00: a recovery.
    kubeapi.add(_pod_at("chat-8", "2026-11-26T08:00:00Z", "2026-11-26T11:00:00Z"))
    watch = asyncio.create_task(roster.run())
    answers = Answers(fleet, startups=roster)
    sel = parse_selector("app=chat")
    starts = ("08:01:40", "08:02:00", "08:04:10", "08:03:00")
    try:
        await until(lambda: roster.ready()[0], what="the pods listed")
        for i, _ in enumerate(starts):  # created, running, loading their model
            kubeapi.add(_pod_at(f"chat-{i}", "2026-11-26T08:00:00Z", "2026-11-26T08:00:30Z",
                                ready=False))
        kubeapi.add(_pod_at("chat-9", "2026-11-26T08:00:00Z", "2026-11-26T08:00:30Z",
                            ready=False, restarts=2))
        other = _pod_at("other-0", "2026-11-26T08:00:00Z", "2026-11-26T08:00:30Z",
                        ready=False)
        kubeapi.add(other)
        await until(lambda: len(roster.watch.items) == 7, what="the starting pods seen")
        for i, ready_since in enumerate(starts):
            kubeapi.modify(_pod_at(f"chat-{i}", "2026-11-26T08:00:00Z",
                                   f"2026-11-26T{ready_since}Z"))
        kubeapi.modify(_pod_at("chat-9", "2026-11-26T08:00:00Z", "2026-11-26T11:00:00Z",
                               restarts=2))  # Ready after restarts: not a start-up
        kubeapi.modify(_pod_at("other-0", "2026-11-26T08:00:00Z", "2026-11-26T08:30:00Z"))
        await until(lambda: len(roster.startups("llm", sel)) == 4, what="four start-ups")
        assert dict(roster.startups("llm", sel)) == {
            "chat-0": 100.0, "chat-1": 120.0, "chat-2": 250.0, "chat-3": 180.0}
        # chat-0 flaps: not Ready, then Ready again later; its start-up stays the first.
        kubeapi.modify(_pod_at("chat-0", "2026-11-26T08:00:00Z", "2026-11-26T09:00:00Z",
                               ready=False))
        kubeapi.modify(_pod_at("chat-0", "2026-11-26T08:00:00Z", "2026-11-26T09:10:00Z"))
        await until(lambda: [p.startup_s for p in roster.watch.items.values()
                             if p.name == "chat-0"] == [4200.0],
                    what="chat-0 Ready again, its condition at 09:10")
        assert dict(roster.startups("llm", sel))["chat-0"] == 100.0
        fleet.update_node("n-a", [vllm_pod(f"chat-{i}", 1.0, at=clock.now, app="chat")
                                  for i in (*range(4), 8)])
        workload = Workload("llm", "chat", parse_metadata(
            {"podSelector": "app=chat", "profile": "vllm-planner"}))
        got = answers.value(workload, workload.trigger.targets[0])
        assert not isinstance(got, Unavailable), got
        assert got.plan is not None
        # Nearest rank of 4: ceil(0.9 x 4) = the 4th of (100, 120, 180, 250).
        assert (got.plan.startup, got.plan.startup_source) == (250.0, "measured")
    finally:
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
        await api.close()


@pytest.mark.parametrize(("limits", "gpus"), [
    ({"nvidia.com/gpu": "1"}, True), ({"amd.com/gpu": "1"}, True),
    ({"amd.com/cpx_nps4": "1"}, True), ({"cpu": "1"}, False)])
def test_pods_of_either_vendors_gpus_must_report(limits: dict[str, str], gpus: bool) -> None:
    raw = gpu_pod("a-0", "n-a")
    raw["spec"]["containers"] = [{"name": "main", "resources": {"limits": limits}}]
    assert running_pod(raw).gpus is gpus
