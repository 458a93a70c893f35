"""Scenario 2: a plain HPA reads gpuscale's custom metrics API through the real
aggregation layer (front-proxy authentication, real RBAC and SubjectAccessReviews).

gpuscale is installed from the Helm chart with ``metricsApi.enabled`` and a serving
certificate of our own (``certManager: false``), as a user without cert-manager would
(cluster/helm.py); the stand-in kubelet mounts the Secret into the scaler pods."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cluster.session import Cluster
from tests.cluster.workloads import NAMESPACE, inference_deployment, namespace
from tests.support.polling import until_sync

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def metrics_api(cluster: Cluster) -> None:
    """The cluster installs gpuscale from the Helm chart with its metrics API
    (cluster/helm.py); it answers through the aggregator once the scaler pods run."""
    until_sync(lambda: cluster.kubectl("get", "--raw", "/apis/custom.metrics.k8s.io/v1beta2",
                                       check=False), within=180, every=1.0,
               what="custom.metrics.k8s.io/v1beta2 answers through the aggregator")


def _hpa(name: str, metric: dict[str, Any], behavior: bool = True) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
        "minReplicas": 1, "maxReplicas": 8, "metrics": [metric]}
    if behavior:
        spec["behavior"] = {"scaleDown": {"stabilizationWindowSeconds": 0}}
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec}


@pytest.mark.usefixtures("metrics_api")
def test_the_gardener_guides_hpa_on_pod_gpu_utilization(cluster: Cluster) -> None:
    """The guide's HPA as written (Pods metric, AverageValue 10, no behavior): each pod's
    attributed GPU duty cycle, served by gpuscale instead of DCGM -> Prometheus ->
    prometheus-adapter."""
    name = "guide-chat"
    cluster.apply(namespace(), inference_deployment(name))
    cluster.apply(_hpa(name, {"type": "Pods", "pods": {
        "metric": {"name": "pod_gpu_utilization"},
        "target": {"type": "AverageValue", "averageValue": "10"}}}, behavior=False))
    raw = f"/apis/custom.metrics.k8s.io/v1beta1/namespaces/{NAMESPACE}/pods/*/pod_gpu_utilization"
    cluster.load(f"{NAMESPACE}/{name}", 8)  # one replica: 8 of 16 running, 50 % busy
    until_sync(lambda: _values(cluster, raw, name) == [50.0], within=60, every=1.0,
               what="the pod's GPU utilization through kubectl get --raw")
    until_sync(lambda: cluster.replicas(NAMESPACE, name) >= 4, within=180, every=1.0,
               what="the real HPA scaled up on pod_gpu_utilization")
    cluster.kubectl("delete", "hpa,deployment", name, "-n", NAMESPACE)


@pytest.mark.usefixtures("metrics_api")
def test_an_object_metric_scales_up_and_down(cluster: Cluster) -> None:
    name = "object-chat"
    cluster.apply(namespace(), inference_deployment(name))
    cluster.apply(_hpa(name, {"type": "Object", "object": {
        "describedObject": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
        "metric": {"name": "gpuscale_vllm_requests"},
        "target": {"type": "AverageValue", "averageValue": "8"}}}))
    cluster.load(f"{NAMESPACE}/{name}", 40)
    until_sync(lambda: cluster.replicas(NAMESPACE, name) >= 5, within=180, every=1.0,
               what="the real HPA scaled up on gpuscale_vllm_requests")
    cluster.load(f"{NAMESPACE}/{name}", 8)
    until_sync(lambda: cluster.replicas(NAMESPACE, name) <= 2, within=180, every=1.0,
               what="the real HPA scaled down")
    cluster.kubectl("delete", "hpa,deployment", name, "-n", NAMESPACE)


def _values(cluster: Cluster, path: str, name: str) -> list[float]:
    out = cluster.kubectl("get", "--raw", path, check=False)
    try:
        items = json.loads(out)["items"]
    except (ValueError, KeyError):
        return []
    return sorted(_quantity(i["value"]) for i in items
                  if i["describedObject"]["name"].startswith(name))


def _quantity(q: str) -> float:
    return float(q[:-1]) / 1000 if q.endswith("m") else float(q)
