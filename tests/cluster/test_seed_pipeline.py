"""Scenario 3: the seeds' pipeline verbatim - gpuscale's dcgm-compatible exporter ->
Prometheus -> the real prometheus-adapter with the seed's rule
(``seriesQuery: pod_gpu_utilization{pod!=""}``, ``avg(<<.Series>>{<<.LabelMatchers>>}) by
(<<.GroupBy>>)``, the recording rule's ``label_replace``) -> the real HPA scales the
workload. It takes custom.metrics.k8s.io from gpuscale's metrics API, so it runs last."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator

import pytest

from cluster import netns, seed
from cluster.session import Cluster
from tests.cluster.workloads import NAMESPACE, inference_deployment, namespace
from tests.support.polling import until_sync

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def pipeline(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    if shutil.which("prometheus") is None:
        pytest.fail("prometheus not found: ./dev test installs Debian's prometheus package")
    d = tmp_path_factory.mktemp("seed")
    layout = cluster.layout
    slices = cluster.get("endpointslices", "-n", "gpuscale", "-l",
                         "kubernetes.io/service-name=gpuscale-agent")["items"]
    config = seed.prometheus_files(d / "prometheus", seed.targets(slices))
    adapter_config, certs, ca = seed.adapter_files(layout, d / "adapter")
    procs = []
    for name, argv in (("prometheus", seed.prometheus_argv(config, d / "tsdb")),
                       ("prometheus-adapter", seed.adapter_argv(
                           cluster.bin_dir, layout, adapter_config, certs))):
        log = (layout.logs / f"{name}.log").open("ab")
        procs.append(subprocess.Popen(netns.enter(layout, argv), stdout=log,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        log.close()
    try:
        cluster.apply(*seed.objects(layout, ca))
        until_sync(lambda: "prometheus-adapter" in cluster.kubectl(
            "get", "apiservice", "v1beta1.custom.metrics.k8s.io", "-o",
            "jsonpath={.spec.service.name}") and cluster.kubectl(
            "get", "--raw", "/apis/custom.metrics.k8s.io/v1beta1", check=False),
                   within=120, every=1.0, what="prometheus-adapter serves custom metrics")
        yield
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)


@pytest.mark.usefixtures("pipeline")
def test_the_guides_hpa_scales_through_prometheus_and_prometheus_adapter(
        cluster: Cluster) -> None:
    name = "seed-chat"
    cluster.apply(namespace(), inference_deployment(name))
    cluster.apply({
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                    "name": name},
                 "minReplicas": 1, "maxReplicas": 8,
                 "metrics": [{"type": "Pods", "pods": {
                     "metric": {"name": "pod_gpu_utilization"},
                     "target": {"type": "AverageValue", "averageValue": "10"}}}]}})
    cluster.load(f"{NAMESPACE}/{name}", 8)  # one replica: 50 % busy
    raw = f"/apis/custom.metrics.k8s.io/v1beta1/namespaces/{NAMESPACE}/pods/*/pod_gpu_utilization"
    until_sync(lambda: name in cluster.kubectl("get", "--raw", raw, check=False), within=120,
               every=2.0, what="the pod's utilization through Prometheus and the adapter")
    until_sync(lambda: cluster.replicas(NAMESPACE, name) >= 4, within=240, every=2.0,
               what="the real HPA scaled up on prometheus-adapter's pod_gpu_utilization")
    cluster.kubectl("delete", "hpa,deployment", name, "-n", NAMESPACE)
