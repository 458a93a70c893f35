"""Resolving a ScaledObject's scaleTargetRef to its pods through the API (watched)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from hypothesis import given

from gpuscale.common.errors import Unavailable
from gpuscale.proto import externalscaler_pb2 as pb
from gpuscale.proto import externalscaler_pb2_grpc as pb_grpc
from gpuscale.scaler.answers import Answers
from gpuscale.scaler.core.selector import Selector
from gpuscale.scaler.edges.keda import ScalerServer, ScalerService
from gpuscale.scaler.recorder import Recorder
from gpuscale.scaler.sources.workloads import WorkloadResolver, selector_from_label_selector
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.stream.records import PodRecord
from tests.peers.kubeapi import (
    DEPLOYMENTS,
    SCALEDOBJECTS,
    STATEFULSETS,
    KubeApiPeer,
    api_client,
    make_scaledobject,
    make_workload,
)
from tests.support.polling import until
from tests.support.strategies import json_values


@pytest.fixture
async def resolver(kubeapi: KubeApiPeer) -> AsyncIterator[WorkloadResolver]:
    api = api_client(kubeapi)
    r = WorkloadResolver(api, backoff_s=(0.05,), scale_refresh_s=0.1)
    task = asyncio.create_task(r.run())
    yield r
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await api.close()




def text(x: Selector | Unavailable) -> str:
    return x.text if isinstance(x, Selector) else f"ERR {x.reason}"


async def test_deployment_statefulset_and_any_scalable(kubeapi: KubeApiPeer,
                                                       resolver: WorkloadResolver) -> None:
    kubeapi.add(make_workload("Deployment", "llm", "vllm", {"app": "vllm"},
                           [{"key": "tier", "operator": "In", "values": ["a", "b"]}]),
             DEPLOYMENTS)
    kubeapi.add(make_workload("StatefulSet", "llm", "train", {"app": "train"}), STATEFULSETS)
    kubeapi.add(make_scaledobject("llm", "so-vllm", "vllm"), SCALEDOBJECTS)
    kubeapi.add(make_scaledobject("llm", "so-train", "train", kind="StatefulSet"), SCALEDOBJECTS)
    kubeapi.discovery["example.com/v1"] = [{"name": "inferencesets", "kind": "InferenceSet"},
                                 {"name": "inferencesets/scale", "kind": "Scale"}]
    kubeapi.scales[("inferencesets", "llm", "phi")] = "app=phi,!canary"
    kubeapi.add(make_scaledobject("llm", "so-phi", "phi", kind="InferenceSet",
                               api_version="example.com/v1"), SCALEDOBJECTS)
    await until(lambda: text(resolver.resolve("llm", "so-phi")) == "app=phi,!canary")
    assert text(resolver.resolve("llm", "so-vllm")) == "app=vllm,tier in (a,b)"
    assert text(resolver.resolve("llm", "so-train")) == "app=train"
    assert resolver.resolve("llm", "nope") == Unavailable("ScaledObject llm/nope not found")


async def test_target_changes_are_followed(kubeapi: KubeApiPeer,
                                           resolver: WorkloadResolver) -> None:
    kubeapi.add(make_workload("Deployment", "llm", "vllm", {"app": "vllm"}), DEPLOYMENTS)
    kubeapi.add(make_scaledobject("llm", "so", "vllm"), SCALEDOBJECTS)
    await until(lambda: text(resolver.resolve("llm", "so")) == "app=vllm")
    kubeapi.modify(make_workload("Deployment", "llm", "vllm", {"app": "vllm", "v": "2"}),
                DEPLOYMENTS)
    await until(lambda: text(resolver.resolve("llm", "so")) == "app=vllm,v=2")
    kubeapi.delete("uid-Deployment-llm-vllm", DEPLOYMENTS)
    await until(lambda: resolver.resolve("llm", "so")
                == Unavailable("Deployment llm/vllm not found"))


async def test_resolved_workload_served_over_grpc(kubeapi: KubeApiPeer,
                                                  resolver: WorkloadResolver) -> None:
    kubeapi.add(make_workload("Deployment", "llm", "vllm", {"app": "vllm"}), DEPLOYMENTS)
    kubeapi.add(make_scaledobject("llm", "so", "vllm"), SCALEDOBJECTS)
    fleet = FleetView(monotonic=lambda: 0.0)
    fleet.update_node("n", [PodRecord("llm", f"p{i}", "n", {"app": "vllm"}, None, True,
                                      {"gpu-utilization": 30.0}, 0.0) for i in range(3)])
    server = ScalerServer(ScalerService(Answers(fleet, resolver=resolver)), host="127.0.0.1",
                          port=0)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.ExternalScalerStub(ch)
            req = pb.GetMetricsRequest(metricName="s0-gpuscale-gpu-utilization",
                                       scaledObjectRef=pb.ScaledObjectRef(name="so",
                                                                          namespace="llm"))
            await until(lambda: isinstance(resolver.resolve("llm", "so"), Selector))
            got = await stub.GetMetrics(req)
            assert got.metricValues[0].metricValueFloat == 90.0
            missing = pb.GetMetricsRequest(metricName="gpuscale-gpu-utilization",
                                           scaledObjectRef=pb.ScaledObjectRef(
                                               name="ghost", namespace="llm"))
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.GetMetrics(missing)
            assert err.value.code() is grpc.StatusCode.UNAVAILABLE
            assert "scale target: ScaledObject llm/ghost not found" in (err.value.details()
                                                                       or "")
    finally:
        await server.stop(0.2)


async def test_forbidden_is_reported(kubeapi: KubeApiPeer, resolver: WorkloadResolver) -> None:
    kubeapi.allowed = False
    await until(lambda: any("forbidden (403)" in s for s in resolver.state()))
    assert "ScaledObjects not listed yet" in text(resolver.resolve("llm", "so"))


async def test_hostile_api_replies_do_not_take_the_resolver_down(kubeapi: KubeApiPeer) -> None:
    """A reply the API contract does not allow, on any of the three watches, is an error
    each watch logs and retries; none of them ends the resolver's task group."""
    kubeapi.next_list_replies.extend([
        (200, b'{"metadata": {"resourceVersion": "1"}, "items": [1]}'),
        (200, b'{"metadata": {"resourceVersion": "1"}, "items": [{"metadata": {}}]}'),
        (200, b'{"metadata": {"resourceVersion": "1"}, "items": {"so": {}}}')])
    kubeapi.next_watch_bodies.extend([b'{"type": "ADDED", "object": "so"}\n',
                                      b'{"type": ["ADDED"], "object": {}}\n',
                                      b'[{"type": "ADDED"}]\n'])
    # and objects of the wrong shape inside well-formed events
    kubeapi.add({"metadata": {"uid": "u-odd-so", "name": "odd", "namespace": "llm"},
                 "spec": "vllm"}, SCALEDOBJECTS)
    kubeapi.add({"metadata": {"uid": "u-odd-d", "name": "odd", "namespace": "llm"},
                 "spec": {"selector": {"matchLabels": ["app"],
                                       "matchExpressions": [{"key": "a", "operator": "In",
                                                             "values": [1]}, "x"]}}},
                DEPLOYMENTS)
    api = api_client(kubeapi)
    resolver = WorkloadResolver(api, backoff_s=(0.05,), scale_refresh_s=0.1)
    task = asyncio.create_task(resolver.run())
    try:
        kubeapi.add(make_workload("Deployment", "llm", "vllm", {"app": "vllm"}), DEPLOYMENTS)
        kubeapi.add(make_scaledobject("llm", "so", "vllm"), SCALEDOBJECTS)
        await until(lambda: not kubeapi.next_list_replies and not kubeapi.next_watch_bodies
                    and kubeapi.watching == 3, what="every hostile reply served")
        await until(lambda: text(resolver.resolve("llm", "so")) == "app=vllm")
        assert not task.done()
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await api.close()


@pytest.mark.parametrize(("sel", "expect"), [
    ({"matchLabels": {"b": "2", "a": "1"}}, "a=1,b=2"),
    ({"matchExpressions": [{"key": "x", "operator": "Exists"},
                           {"key": "y", "operator": "DoesNotExist"},
                           {"key": "z", "operator": "NotIn", "values": ["q"]}]},
     "x,!y,z notin (q)"),
])
def test_label_selector_objects(sel: dict[str, object], expect: str) -> None:
    assert selector_from_label_selector(sel).text == expect


@pytest.mark.parametrize("sel", [{}, {"matchExpressions": [{"key": "x", "operator": "Gt"}]}])
def test_bad_label_selector_objects(sel: dict[str, object]) -> None:
    from gpuscale.scaler.core.selector import SelectorError

    with pytest.raises(SelectorError):
        selector_from_label_selector(sel)


SELECTOR_KEYS = ["matchLabels", "matchExpressions", "key", "operator", "values", "app"]


@given(json_values(SELECTOR_KEYS))
def test_any_json_label_selector_is_a_selector_or_refused(sel: object) -> None:
    from gpuscale.scaler.core.selector import SelectorError

    try:
        got = selector_from_label_selector(sel if isinstance(sel, dict) else {"x": sel})
    except SelectorError:
        return
    assert got.requirements


async def test_explain_reads_the_scaledobject_and_its_target(kubeapi: KubeApiPeer,
                                                             resolver: WorkloadResolver,
                                                             fleet: FleetView) -> None:
    """What gpuscale explain needs from the watches: the ScaledObject's bounds, fallback
    and HPA behavior, and the target's spec.replicas; found by the Deployment's name too."""
    from gpuscale.proto import inspect_pb2 as ipb
    from gpuscale.proto import inspect_pb2_grpc as ipb_grpc
    from gpuscale.scaler.edges.inspect import SERVICE, Inspector, add_to_server

    kubeapi.add(make_workload("Deployment", "llm", "vllm", {"app": "vllm"}), DEPLOYMENTS)
    so = make_scaledobject("llm", "so-vllm", "vllm")
    so["spec"].update({"minReplicaCount": 1, "maxReplicaCount": 12, "cooldownPeriod": 60,
                       "fallback": {"failureThreshold": 4, "replicas": 6,
                                    "behavior": "currentReplicasIfHigher"},
                       "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {
                           "scaleDown": {"stabilizationWindowSeconds": 600}}}}})
    kubeapi.add(so, SCALEDOBJECTS)
    await until(lambda: resolver.replicas("llm", "Deployment", "vllm") == 2,
                what="the Deployment watched")
    await until(lambda: resolver.scaled_object("llm", "so-vllm") is not None,
                what="the ScaledObject watched")
    service = ScalerService(Answers(fleet, resolver=resolver))
    inspector = Inspector(Recorder(service.answers, service.history), resolver)
    server = ScalerServer(service, host="127.0.0.1", port=0,
                          extra=[(SERVICE, lambda s: add_to_server(inspector, s))])
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        await pb_grpc.ExternalScalerStub(ch).GetMetricSpec(
            pb.ScaledObjectRef(namespace="llm", name="so-vllm", scalerMetadata={}))
        got = await ipb_grpc.InspectStub(ch).Explain(
            ipb.ExplainRequest(namespace="llm", name="vllm"))  # the Deployment's name
    await server.stop(0.5)
    st = got.scale_target
    assert got.name == "so-vllm"
    assert got.selector == "app=vllm"
    assert (st.known, st.kind, st.name, st.replicas) == (True, "Deployment", "vllm", 2)
    assert (st.min_replicas, st.max_replicas, st.cooldown_period) == (1, 12, 60)
    assert (st.fallback_replicas, st.fallback_failures, st.fallback_behavior) == (
        6, 4, "currentReplicasIfHigher")
    assert '"stabilizationWindowSeconds": 600' in st.behavior_json
