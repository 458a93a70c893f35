"""custom.metrics.k8s.io over real HTTPS: kubectl with a client certificate, the
aggregator's front proxy with request headers, delegated authorization answered by the
test API server, and the answers' rules (never a pod left out, 503 with the reason).

The fleet judges freshness, and the authorizer its cached reviews, on a clock the tests
move by hand (``clock``): data recorded once stays fresh and a review cached however slowly
the machine serves the requests; staleness is a test's own step (a record sampled 60 s
before the clock's now, or the clock moved)."""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import kubernetes_validate
import pytest
import yaml
from yarl import URL

from gpuscale.common.errors import DataUnavailable
from gpuscale.metrics_api.answers import MetricAnswers, NotFound
from gpuscale.metrics_api.authz import Authorizer
from gpuscale.metrics_api.main import configmap_reader
from gpuscale.metrics_api.quantity import parse_quantity
from gpuscale.metrics_api.server import MetricsApiServer, TrustSource
from gpuscale.models.hpa import Hpa, Metric, MetricSource, TargetType
from gpuscale.scaler.answers import Answers
from gpuscale.scaler.sources.roster import AgentRoster, PodRoster
from gpuscale.scaler.sources.workloads import WorkloadResolver
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.scaler.state.plan_book import PlanBook
from gpuscale.stream.records import PodRecord
from gpuscale.stream.subscriber import AgentSubscriber
from tests.peers.kubeapi import (
    DEPLOYMENTS,
    STATEFULSETS,
    KubeApiPeer,
    api_client,
    make_pod,
    make_workload,
)
from tests.support.clock import Clock
from tests.support.kubeconfig import write_kubeconfig
from tests.support.pki import HPA_USER, issue, make_ca, pem
from tests.support.polling import until

V1B1 = "/apis/custom.metrics.k8s.io/v1beta1"
V1B2 = "/apis/custom.metrics.k8s.io/v1beta2"


def gpu_pod(name: str, app: str = "vllm", ready: bool = True,
            ns: str = "llm") -> dict[str, Any]:
    pod = make_pod(ns, name, f"uid-{name}", labels={"app": app}, ready=ready)
    pod["spec"]["containers"] = [{"name": "main",
                                  "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    return pod


def record(fleet: FleetView, name: str, app: str = "vllm", ready: bool = True,
           ns: str = "llm", **signals: float) -> PodRecord:
    sig = {k.replace("_", "-"): v for k, v in signals.items()}
    return PodRecord(ns, name, "node-a", {"app": app}, None, ready, sig, fleet.now())


def policy(spec: dict[str, Any]) -> tuple[bool, bool, str]:
    """RBAC as the seed guides grant it: the HPA controller and alice read metrics;
    mallory is denied by name; everyone may read discovery."""
    if "nonResourceAttributes" in spec:
        return True, False, "RBAC: allowed by ClusterRoleBinding \"system:discovery\""
    attrs = spec["resourceAttributes"]
    if spec["user"] == "mallory":
        return False, True, "mallory is banned"
    if spec["user"] in (HPA_USER, "alice") and attrs.get("group") == "custom.metrics.k8s.io":
        return True, False, "RBAC: allowed by ClusterRoleBinding \"hpa-metrics\""
    return False, False, ""


@dataclass
class Cluster:
    server: MetricsApiServer
    peer: KubeApiPeer
    fleet: FleetView
    dir: Path
    url: str

    def client_ssl(self, who: str) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.dir / "serving-ca.crt"))
        if who:
            ctx.load_cert_chain(self.dir / f"{who}.crt", self.dir / f"{who}.key")
        return ctx

    async def connect(self, who: str = "hpa"
                      ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A raw TLS connection to the server (as ``who``; "" no client certificate)."""
        port = int(self.url.rsplit(":", 1)[1])
        return await asyncio.open_connection("127.0.0.1", port, ssl=self.client_ssl(who))

    async def get(self, path: str, who: str = "hpa", headers: dict[str, str] | None = None,
                  method: str = "GET") -> tuple[int, dict[str, Any]]:
        async with aiohttp.ClientSession() as s, s.request(
                method, URL(self.url + path, encoded=True), ssl=self.client_ssl(who),
                headers=headers or {}) as r:
            return r.status, await r.json(content_type=None)

    def kubectl(self, path: str) -> tuple[int, str]:
        p = subprocess.run(["kubectl", "--kubeconfig", str(self.dir / "kubeconfig"),
                            "get", "--raw", path], capture_output=True, text=True,
                           timeout=60, check=False)
        return p.returncode, p.stdout if p.returncode == 0 else p.stderr


def write_certs(d: Path) -> dict[str, str]:
    """The cluster's CAs, a serving certificate, and the clients' certificates; returns
    the trust ConfigMap's data."""
    cluster_ca, proxy_ca, serving_ca = (make_ca("kubernetes"), make_ca("front-proxy-ca"),
                                        make_ca("gpuscale-metrics-ca"))
    (d / "serving-ca.crt").write_bytes(pem(serving_ca[0]))
    leaves = {
        "serving": issue(serving_ca, "gpuscale-metrics", "localhost"),
        "hpa": issue(cluster_ca, HPA_USER, client=True, orgs=("system:serviceaccounts",)),
        "mallory": issue(cluster_ca, "mallory", client=True),
        "bob": issue(cluster_ca, "bob", client=True),
        "proxy": issue(proxy_ca, "front-proxy-client", client=True),
        "other-proxy": issue(proxy_ca, "someone-else", client=True),
        "expired": issue(cluster_ca, HPA_USER, client=True, valid_days=-1),
        "stranger": issue(make_ca("kubernetes"), HPA_USER, client=True),  # same CA name
    }
    for name, (crt, key) in leaves.items():
        (d / f"{name}.crt").write_bytes(crt)
        (d / f"{name}.key").write_bytes(key)
    return {
        "client-ca-file": pem(cluster_ca[0]).decode(),
        "requestheader-client-ca-file": pem(proxy_ca[0]).decode(),
        "requestheader-allowed-names": '["front-proxy-client"]',
        "requestheader-username-headers": '["X-Remote-User"]',
        "requestheader-group-headers": '["X-Remote-Group"]',
        "requestheader-extra-headers-prefix": '["X-Remote-Extra-"]',
    }


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


# -- authentication ----------------------------------------------------------------------------


async def test_front_proxy_speaks_for_the_user_in_its_headers(cluster: Cluster) -> None:
    headers = {"X-Remote-User": "alice", "X-Remote-Group": "team-a",
               "X-Remote-Extra-Scopes": "read"}
    code, body = await cluster.get(f"{V1B2}/namespaces/llm/pods/*/gpu_utilization",
                                   "proxy", headers)
    assert code == 200, body
    spec = cluster.peer.reviews[-1]
    assert spec["user"] == "alice"
    assert spec["groups"] == ["team-a", "system:authenticated"]
    assert spec["extra"] == {"scopes": ["read"]}
    assert spec["resourceAttributes"] == {
        "verb": "get", "group": "custom.metrics.k8s.io", "version": "v1beta2",
        "resource": "pods", "namespace": "llm", "name": "*", "subresource": "gpu_utilization"}


@pytest.mark.parametrize(("who", "headers", "code"), [
    ("", {"X-Remote-User": "alice"}, 401),  # forged headers, no certificate
    ("other-proxy", {"X-Remote-User": "alice"}, 401),  # a front-proxy CN not allowed
    ("proxy", {}, 401),  # the front proxy without a user: nobody
    ("expired", {}, 401),
    ("stranger", {}, 401),  # a CA with the cluster CA's name, not its key
])
async def test_who_is_not_authenticated(cluster: Cluster, who: str,
                                        headers: dict[str, str], code: int) -> None:
    if who in ("expired", "stranger"):  # the handshake itself may refuse these
        try:
            got, body = await cluster.get(f"{V1B2}/namespaces/llm/pods/*/gpu_utilization",
                                          who, headers)
        except aiohttp.ClientError:
            return
    else:
        got, body = await cluster.get(f"{V1B2}/namespaces/llm/pods/*/gpu_utilization",
                                      who, headers)
    assert (got, body["kind"], body["reason"]) == (code, "Status", "Unauthorized")
    assert not cluster.peer.reviews


async def test_a_client_certificate_cannot_claim_another_user(cluster: Cluster) -> None:
    """bob's certificate is the cluster CA's, not the front proxy's: his X-Remote-User
    header is ignored, and he is asked about as bob (and refused)."""
    code, body = await cluster.get(f"{V1B2}/namespaces/llm/pods/*/gpu_utilization", "bob",
                                   {"X-Remote-User": "alice"})
    assert code == 403
    assert cluster.peer.reviews[-1]["user"] == "bob"
    assert body["message"].startswith('User "bob" cannot get pods/gpu_utilization')


# -- authorization ------------------------------------------------------------------------------


async def test_reviews_decide_and_are_cached(cluster: Cluster) -> None:
    code, body = await cluster.get(f"{V1B2}/namespaces/llm/pods/*/gpu_utilization",
                                   "mallory")
    assert (code, body["reason"]) == (403, "Forbidden")
    assert "mallory is banned" in body["message"]
    path = f"{V1B2}/namespaces/llm/pods/*/gpu_utilization"
    before = len(cluster.peer.reviews)
    for _ in range(5):
        assert (await cluster.get(path))[0] == 200
    assert len(cluster.peer.reviews) == before + 1  # one review, then the cache


async def test_a_review_that_fails_refuses_the_request(cluster: Cluster) -> None:
    def broken(spec: dict[str, Any]) -> tuple[bool, bool, str]:
        raise RuntimeError("authorizer down")

    cluster.peer.authorize = broken  # the test server answers 500
    code, body = await cluster.get(f"{V1B2}/namespaces/llm/pods/*/tgi_queue_size")
    assert code == 503
    assert body["kind"] == "Status"
    assert "subjectaccessreviews" in body["message"]


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


async def test_slow_clients_do_not_hold_up_the_others(cluster: Cluster) -> None:
    """200 connections that finish the TLS handshake and then send half a request line
    and stall: answers to everyone else go on."""
    stalled = []
    for _ in range(200):
        _, writer = await cluster.connect()
        writer.write(b"GET /apis/custom.metrics.k8s.io/v1beta2/namesp")
        await writer.drain()
        stalled.append(writer)
    try:
        code, body = await cluster.get(f"{V1B2}/namespaces/llm/pods/*/gpu_utilization")
        assert code == 200, body
    finally:
        for w in stalled:
            w.close()


async def test_no_trust_configmap_yet_means_not_listening_then_serving(
        tmp_path: Path, kubeapi: KubeApiPeer) -> None:
    """Without extension-apiserver-authentication (RBAC missing, a cluster without
    aggregation) the server waits and retries, and the scaler beside it keeps running."""
    data = write_certs(tmp_path)
    api = api_client(kubeapi)
    server = MetricsApiServer(
        MetricAnswers(Answers(FleetView(), plans=PlanBook()), None), Authorizer(api),
        TrustSource(configmap_reader(api)), tmp_path / "serving.crt",
        tmp_path / "serving.key", "127.0.0.1", 0)
    bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(server.serve(bound.set_result))
    try:
        await until(lambda: "not found" in server.trust.error, what="a failed read")
        assert not bound.done()
        kubeapi.set_configmap("kube-system", "extension-apiserver-authentication", data)
        await asyncio.wait_for(bound, 10)
        assert server.trust.error == ""
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await api.close()


async def test_client_certificate_users_are_authenticated_users(cluster: Cluster) -> None:
    """RBAC bound to system:authenticated (discovery, a readers' group) applies to a
    client certificate's user too, as kube-apiserver adds the group to everyone it knows."""
    await cluster.get(f"{V1B2}/namespaces/llm/pods/*/gpu_utilization", "bob")
    assert cluster.peer.reviews[-1]["groups"] == ["system:authenticated"]


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


async def test_rbac_without_the_trust_configmap_is_named(tmp_path: Path,
                                                        kubeapi: KubeApiPeer) -> None:
    """The usual broken install: no RoleBinding to extension-apiserver-authentication-
    reader. The API server refuses that one read (403); the reason says so."""
    kubeapi.set_configmap("kube-system", "extension-apiserver-authentication",
                          write_certs(tmp_path))
    kubeapi.forbidden = {"/api/v1/namespaces/kube-system/configmaps"}
    api = api_client(kubeapi)
    server = MetricsApiServer(
        MetricAnswers(Answers(FleetView(), plans=PlanBook()), None), Authorizer(api),
        TrustSource(configmap_reader(api)), tmp_path / "serving.crt",
        tmp_path / "serving.key", "127.0.0.1", 0)
    task = asyncio.create_task(server.serve())
    try:
        await until(lambda: "403" in server.trust.error, what="a refused read")
        assert "forbidden" in server.trust.error
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await api.close()


# -- whoever reaches 6443: malformed requests, too many connections, slow heads ----------


async def _raw(cluster: Cluster, data: bytes, who: str = "") -> tuple[int, dict[str, Any]]:
    """Send ``data`` as it is over TLS (no client certificate unless ``who``); the status
    and the JSON body of the answer."""
    reader, writer = await cluster.connect(who)
    try:
        writer.write(data)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


async def test_an_oversized_request_is_a_status_and_one_log_line_a_minute(
        cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    """Without any certificate, a 10 KB+ request line or an 8 KB+ header: a Kubernetes
    Status (400, 431), never aiohttp's text, and the log gets one line per peer a minute,
    no traceback, however many come."""
    caplog.set_level(logging.WARNING)
    line = b"GET /apis/" + b"a" * 12_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    header = (b"GET /apis/custom.metrics.k8s.io/v1beta2 HTTP/1.1\r\nHost: x\r\nX-Junk: "
              + b"b" * 9_000 + b"\r\n\r\n")
    for _ in range(5):
        code, body = await _raw(cluster, line)
        assert (code, body["kind"], body["code"]) == (400, "Status", 400)
        assert "request line is larger" in body["message"]
        code, body = await _raw(cluster, header)
        assert (code, body["kind"], body["code"]) == (431, "Status", 431)
        assert "header is larger" in body["message"]
    code, body = await _raw(cluster, b"\x16\x03garbage that is not HTTP\r\n\r\n")
    assert (code, body["kind"]) == (400, "Status")
    lines = [r for r in caplog.records if "malformed request" in r.getMessage()]
    assert len(lines) == 1  # one peer (127.0.0.1): one line for its 11 bad requests
    assert lines[0].exc_info is None
    assert not [r for r in caplog.records if r.exc_info]  # no traceback anywhere
    assert cluster.server.guard.rejected == 11
    # The server goes on answering the aggregator.
    code, _ = await cluster.get(f"{V1B2}/namespaces/llm/pods/*/gpu_utilization")
    assert code == 200


async def test_connections_past_the_cap_are_closed_at_once(cluster: Cluster) -> None:
    guard = cluster.server.guard
    guard.max_connections = guard.open + 20
    held = []
    try:
        for _ in range(20):
            held.append((await cluster.connect())[1])
        await until(lambda: guard.open >= guard.max_connections, what="the cap reached")
        reader, writer = await cluster.connect()
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert await asyncio.wait_for(reader.read(), 10) == b""  # closed, unanswered
        writer.close()
        assert guard.refused >= 1
    finally:
        for w in held:
            w.close()
    await until(lambda: guard.open < guard.max_connections, what="connections released")
    code, _ = await cluster.get(f"{V1B2}/namespaces/llm/pods/*/gpu_utilization")
    assert code == 200


async def test_a_slow_loris_is_closed_after_the_head_timeout(cluster: Cluster) -> None:
    """A request head that trickles in holds its connection no longer than the head
    timeout; a connection idle between requests is the keep-alive's business."""
    guard = cluster.server.guard
    guard.head_timeout_s = 0.3
    reader, writer = await cluster.connect()
    try:
        writer.write(b"GET /apis/custom.metrics.k8s.io/v1beta2/namesp")
        for _ in range(20):  # a byte every 0.05 s: never a whole head
            await asyncio.sleep(0.05)
            if reader.at_eof():
                break
            writer.write(b"a")
        assert await asyncio.wait_for(reader.read(), 5) == b""
        assert guard.timed_out >= 1
    finally:
        writer.close()


async def test_a_keep_alive_connection_outlives_the_head_timeout(cluster: Cluster) -> None:
    """The head timeout is for a request still arriving, not for an idle keep-alive
    connection between whole requests (the aggregator keeps its connections)."""
    guard = cluster.server.guard
    guard.head_timeout_s = 0.3
    reader, writer = await cluster.connect()
    try:
        for _ in range(2):
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 200")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            await reader.readexactly(length)
            await asyncio.sleep(1.0)  # idle for three head timeouts
        assert guard.timed_out == 0
    finally:
        writer.close()
