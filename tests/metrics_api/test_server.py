"""custom.metrics.k8s.io over real HTTPS (the ``cluster`` fixture, conftest.py): kubectl
with a client certificate, the values served and the answers' rules (never a pod left out,
503 with the reason), errors as Status objects, the seed HPAs end to end, and thousands of
concurrent requests. Who may read: test_server_auth; hostile clients: test_server_hostile.

The fleet judges freshness, and the authorizer its cached reviews, on a clock the tests
move by hand (``clock``): data recorded once stays fresh and a review cached however slowly
the machine serves the requests; staleness is a test's own step (a record sampled 60 s
before the clock's now, or the clock moved)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import kubernetes_validate
import pytest
import yaml

from gpuscale.common.errors import DataUnavailable
from gpuscale.metrics_api.answers import MetricAnswers, NotFound
from gpuscale.metrics_api.quantity import parse_quantity
from gpuscale.models.hpa import Hpa, Metric, MetricSource, TargetType
from gpuscale.scaler.answers import Answers
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.scaler.state.plan_book import PlanBook
from tests.metrics_api.https_cluster import V1B1, V1B2, Cluster, gpu_pod, record
from tests.support.clock import Clock
from tests.support.polling import until

# -- kubectl, as the seed guide's first command --------------------------------------------


async def test_kubectl_reads_discovery_and_pod_metrics_v1beta1(cluster: Cluster) -> None:
    code, out = await asyncio.to_thread(cluster.kubectl, "/apis/custom.metrics.k8s.io")
    assert code == 0, out
    group = json.loads(out)
    assert group["kind"] == "APIGroup"
    assert group["preferredVersion"]["version"] == "v1beta2"
    code, out = await asyncio.to_thread(cluster.kubectl, V1B1)
    resources = {r["name"] for r in json.loads(out)["resources"]}
    assert {"pods/gpu_utilization", "pods/DCGM_FI_DEV_GPU_UTIL",
            "deployments.apps/gpuscale_planned_replicas"} <= resources
    code, out = await asyncio.to_thread(
        cluster.kubectl, f"{V1B1}/namespaces/llm/pods/*/gpu_utilization")
    assert code == 0, out
    body = json.loads(out)
    assert body["kind"] == "MetricValueList"
    assert body["apiVersion"] == "custom.metrics.k8s.io/v1beta1"
    items = {i["describedObject"]["name"]: i for i in body["items"]}
    assert set(items) == {"vllm-0", "vllm-1"}  # vllm-2 is starting: no data, not Ready
    first = items["vllm-0"]
    assert first["describedObject"] == {"kind": "Pod", "namespace": "llm", "name": "vllm-0",
                                        "apiVersion": "/v1"}
    assert first["metricName"] == "gpu_utilization"
    assert first["value"] == "73250m"
    assert first["timestamp"].endswith("Z")
    assert "metric" not in first


async def test_v1beta2_pods_by_selector_and_object_metrics(cluster: Cluster) -> None:
    code, body = await cluster.get(
        f"{V1B2}/namespaces/llm/pods/*/vllm:kv_cache_usage_perc?labelSelector=app%3Dvllm")
    assert code == 200, body
    values = {i["describedObject"]["name"]: i["value"] for i in body["items"]}
    assert values == {"vllm-0": "420m", "vllm-1": "30m"}  # a fraction, as vLLM exports it
    assert body["items"][0]["metric"] == {"name": "vllm:kv_cache_usage_perc",
                                          "selector": None}
    code, body = await cluster.get(f"{V1B2}/namespaces/llm/pods/vllm-1/DCGM_FI_DEV_FB_USED")
    assert [i["value"] for i in body["items"]] == ["69000500m"]
    code, body = await cluster.get(
        f"{V1B2}/namespaces/llm/deployments.apps/vllm/gpuscale_gpu_utilization")
    assert code == 200, body
    (item,) = body["items"]
    assert item["describedObject"] == {"kind": "Deployment", "namespace": "llm",
                                       "name": "vllm", "apiVersion": "apps/v1"}
    assert item["value"] == "83250m"  # the sum: an AverageValue target divides it
    code, body = await cluster.get(
        f"{V1B1}/namespaces/llm/statefulsets.apps/trainer/gpuscale_gpu_utilization")
    assert code == 200, body
    assert body["items"][0]["value"] == "0"  # no pods: nothing runs, truthfully 0


# -- never a pod left out ----------------------------------------------------------------


async def test_a_ready_pod_without_data_makes_the_list_unavailable(cluster: Cluster) -> None:
    """The HPA takes a pod missing from a Pods metric as idle when it scales up: a list
    without vllm-3 would under-scale. 503 names it, and the HPA holds."""
    cluster.peer.add(gpu_pod("vllm-3"))

    async def refused() -> bool:
        code, _ = await cluster.get(f"{V1B2}/namespaces/llm/pods/*/gpu_utilization"
                                    "?labelSelector=app%3Dvllm")
        return code == 503

    await until(refused, what="the roster saw vllm-3")
    code, body = await cluster.get(f"{V1B2}/namespaces/llm/pods/*/gpu_utilization"
                                   "?labelSelector=app%3Dvllm")
    assert body["kind"] == "Status"
    assert body["reason"] == "ServiceUnavailable"
    assert "llm/vllm-3 on node-a (running and Ready, no data" in body["message"]
    code, body = await cluster.get(f"{V1B2}/namespaces/llm/deployments.apps/vllm/"
                                   "gpuscale_gpu_utilization")
    assert code == 503
    assert "vllm-3" in body["message"]
    code, body = await cluster.get(f"{V1B2}/namespaces/llm/pods/vllm-3/gpu_utilization")
    assert code == 503  # asked by name: still not a 404 or a smaller list


async def test_stale_and_absent_readings_are_503_with_the_reason(cluster: Cluster) -> None:
    from gpuscale.telemetry.model import Absent

    stale = replace(record(cluster.fleet, "vllm-0", gpu_utilization=50.0),
                    sampled_at=cluster.fleet.now() - 60)
    cluster.fleet.update_node("node-a", [
        stale, record(cluster.fleet, "vllm-1", gpu_utilization=10.0)])
    code, body = await cluster.get(f"{V1B2}/namespaces/llm/pods/*/gpu_utilization")
    assert code == 503
    assert "llm/vllm-0 (stale: 60" in body["message"]
    cluster.fleet.update_node("node-a", [
        replace(record(cluster.fleet, "vllm-0"), signals={"gpu-utilization": Absent.UNSUPPORTED}),
        record(cluster.fleet, "vllm-1", gpu_utilization=10.0)])
    code, body = await cluster.get(f"{V1B2}/namespaces/llm/pods/*/gpu_utilization")
    assert code == 503
    assert "vllm-0 (unsupported" in body["message"]


# -- errors as Status objects ----------------------------------------------------------------


@pytest.mark.parametrize(("path", "code", "words"), [
    (f"{V1B2}/namespaces/llm/pods/*/no_such_metric", 404, "could not find the metric"),
    (f"{V1B2}/namespaces/llm/deployments.apps/nope/gpuscale_gpu_utilization", 404,
     'deployments.apps "nope" not found'),
    (f"{V1B2}/namespaces/llm/daemonsets.apps/x/gpuscale_gpu_utilization", 404,
     "could not find the metric"),
    (f"{V1B2}/namespaces/llm/pods/nope/gpu_utilization", 404, "no GPU pod llm/nope"),
    ("/apis/custom.metrics.k8s.io/v2/namespaces/llm/pods/*/gpu_utilization", 404,
     "not served"),
    ("/apis/metrics.k8s.io/v1beta1/pods", 404, "not served here"),
    (f"{V1B2}/namespaces/llm/pods/%2E%2E/gpu_utilization", 400, "cannot be a name"),
    (f"{V1B2}/namespaces/llm/pods/a%2Fb/gpu_utilization", 400, "cannot be a name"),
    (f"{V1B2}/namespaces/%2E%2E/pods/*/gpu_utilization", 400, "cannot be a name"),
    (f"{V1B2}/namespaces/llm/pods/*/gpu_utilization?labelSelector=app%3D%3D%3D", 400,
     "labelSelector: invalid label value"),
    (f"{V1B2}/namespaces/llm/pods/*/gpu_utilization?labelSelector=" + "a%3Db," * 1100
     + "a%3Db", 400, "labelSelector: longer than 4096"),
    (f"{V1B2}/namespaces/llm/pods/*/gpu_utilization?metricLabelSelector=gpu%3D0", 400,
     "no labels to select on"),
    (f"{V1B2}/namespaces/llm/deployments.apps/*/gpuscale_gpu_utilization", 404,
     "only pods are listed by selector"),
    (f"{V1B2}/nodes/node-a/gpu_utilization", 404, "only namespaced objects"),
])
async def test_bad_requests_get_status_errors(cluster: Cluster, path: str, code: int,
                                              words: str) -> None:
    got, body = await cluster.get(path)
    assert (got, body["kind"], body["code"]) == (code, "Status", code), body
    assert words in body["message"]


async def test_only_get(cluster: Cluster) -> None:
    code, body = await cluster.get(f"{V1B2}/namespaces/llm/pods/*/gpu_utilization",
                                   method="DELETE")
    assert (code, body["reason"]) == (405, "MethodNotAllowed")


# -- under load ------------------------------------------------------------------------------------


async def test_thousands_of_concurrent_requests(cluster: Cluster, clock: Clock) -> None:
    """2,000 requests at once over 50 connections: each is answered (200, or 429 beyond
    the in-flight bound), with one review for the one question they all ask. The data
    stays inside the staleness bound, and the review in its cache, however long the
    machine takes to serve them (the clock moves only by hand): every 200 reads the values
    recorded."""
    cluster.server.max_in_flight = 500
    path = f"{V1B2}/namespaces/llm/pods/*/gpu_utilization?labelSelector=app%3Dvllm"
    ctx = cluster.client_ssl("hpa")
    conn = aiohttp.TCPConnector(limit=50, ssl=ctx)
    read: list[str] = []
    async with aiohttp.ClientSession(connector=conn) as s:
        async def one() -> int:
            async with s.get(cluster.url + path) as r:
                body = await r.json(content_type=None)
                if r.status == 200:
                    read.append(json.dumps({i["describedObject"]["name"]: i["value"]
                                            for i in body["items"]}, sort_keys=True))
                return r.status

        codes = await asyncio.gather(*(one() for _ in range(2000)))
    assert set(codes) <= {200, 429}
    assert codes.count(200) >= 1000
    assert set(read) == {'{"vllm-0": "73250m", "vllm-1": "10"}'}  # the values recorded
    assert len(cluster.peer.reviews) == 1
    clock.now += 60  # the same data past the bound: the clock is the one the answers judge by
    status, body = await cluster.get(path)
    assert status == 503, body
    assert "stale" in body["message"]


# -- the seed HPAs, end to end ------------------------------------------------------------------

HPAS = Path(__file__).parents[2] / "deploy" / "examples" / "hpa"


async def desired(cluster: Cluster, hpa: dict[str, Any], current: int) -> int:
    """What the HPA controller decides (control.hpa's model) over values read from this
    API as its metrics client reads them: Pods metrics by the target's selector, Object
    metrics by name."""
    spec, ns = hpa["spec"], hpa["metadata"]["namespace"]
    target = spec["scaleTargetRef"]["name"]
    version = V1B2
    metrics = []
    for m in spec["metrics"]:
        kind = MetricSource(m["type"])
        src = m["pods"] if kind is MetricSource.PODS else m["object"]
        goal = src["target"]
        target_type = TargetType(goal["type"])
        value = float(parse_quantity(str(goal.get("averageValue") or goal.get("value"))))
        if kind is MetricSource.PODS:
            code, body = await cluster.get(f"{version}/namespaces/{ns}/pods/*/"
                                           f"{src['metric']['name']}?labelSelector=app%3D"
                                           f"{target}")
            assert code == 200, body
            pods = tuple(float(parse_quantity(i["value"])) for i in body["items"])
            metrics.append(Metric(kind, target_type, value, pod_values=pods))
        else:
            d = src["describedObject"]
            code, body = await cluster.get(
                f"{version}/namespaces/{ns}/{d['kind'].lower()}s.apps/{d['name']}/"
                f"{src['metric']['name']}")
            assert code == 200, body
            metrics.append(Metric(kind, target_type, value,
                                  float(parse_quantity(body["items"][0]["value"]))))
    model = Hpa(spec["minReplicas"], spec["maxReplicas"])
    return model.step(0.0, current, metrics)


@pytest.mark.parametrize(("name", "want"), [
    # (73.25 + 10) / 2 pods = 41.6 per pod over 30: ceil(2 x 1.39) = 3
    ("dcgm-gpu-utilization.yaml", 3),
    # (40 + 90) us / 2 pods = 65 over 50: ceil(2 x 1.3) = 3
    ("triton-queue-time.yaml", 3),
    # utilization sum 83.25 / 30 -> 3; requests 60 / 32 -> 2: the larger
    ("vllm-object.yaml", 3),
])
async def test_seed_hpas_validate_and_scale_on_values_from_this_api(
        cluster: Cluster, name: str, want: int) -> None:
    (hpa,) = [d for d in yaml.safe_load_all((HPAS / name).read_text()) if d]
    kubernetes_validate.validate(hpa, "1.33.0", strict=True)
    assert await desired(cluster, hpa, current=2) == want


async def test_planner_as_an_object_metric(cluster: Cluster) -> None:
    """gpuscale_planned_replicas takes the planner's settings from the metric selector;
    it plans the Deployment's pods like a vllm-planner trigger."""
    sel = "ttftSeconds%3D2,startupSeconds%3D120"
    code, body = await cluster.get(f"{V1B2}/namespaces/llm/deployments.apps/vllm/"
                                   f"gpuscale_planned_replicas?metricLabelSelector={sel}")
    assert code == 503  # the vLLM rates are not in these records: no plan, and why
    assert "vllm" in body["message"]
    code, body = await cluster.get(f"{V1B2}/namespaces/llm/deployments.apps/vllm/"
                                   "gpuscale_planned_replicas?metricLabelSelector="
                                   "ttftSeconds%3Dfast")
    assert code == 400
    assert "ttftSeconds" in body["message"]
    code, body = await cluster.get(f"{V1B2}/namespaces/llm/deployments.apps/vllm/"
                                   "gpuscale_planned_replicas?metricLabelSelector=gpu%3D1")
    assert code == 400
    assert "the planner takes key=value pairs" in body["message"]


async def test_the_aggregators_availability_check_and_escaped_wildcards(
        cluster: Cluster) -> None:
    """kube-aggregator checks an APIService with its front-proxy certificate as
    system:kube-aggregator in system:masters: 2xx or the APIService is unavailable. Go's
    client escapes ``*`` in a path as %2A."""
    head = {"X-Remote-User": "system:kube-aggregator", "X-Remote-Group": "system:masters"}
    code, body = await cluster.get(V1B2, "proxy", head)
    assert (code, body["kind"]) == (200, "APIResourceList")
    assert {r["namespaced"] for r in body["resources"]} == {True}  # one value, or the
    assert not cluster.peer.reviews  # aggregator's discovery fails; masters need no review
    code, body = await cluster.get(f"{V1B2}/namespaces/llm/pods/%2A/gpu_utilization"
                                   "?labelSelector=app%3Dvllm")
    assert code == 200
    assert len(body["items"]) == 2


def test_a_named_pod_during_a_roster_gap_is_503_not_404() -> None:
    """While an agent is silent any pod may be on its node: not found is not known."""
    class SilentAgent:
        def problems(self, namespace: str, selector: Any, records: Any) -> list[str]:
            return ["agent 10.0.0.9:9401 has not reported (not connected): its node's pods "
                    "are unknown"]

        def ready(self) -> tuple[bool, str]:
            return False, "waiting"

    answers = MetricAnswers(Answers(FleetView(), roster=SilentAgent(), plans=PlanBook()), None)
    with pytest.raises(DataUnavailable, match=r"10\.0\.0\.9:9401 has not reported"):
        answers.pods("llm", "nope", "gpu_utilization")
    with pytest.raises(NotFound, match="no GPU pod llm/nope"):
        MetricAnswers(Answers(FleetView(), plans=PlanBook()), None).pods("llm", "nope",
                                                                "gpu_utilization")


