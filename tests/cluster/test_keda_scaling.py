"""Scenario 1: the real KEDA and the real HPA controller scale a Deployment on the
answers of gpuscale's scaler, itself deployed from our manifests and fed by agents it found
through real EndpointSlices: load rises -> more replicas; load falls -> fewer; quiet ->
zero after KEDA's cooldown; demand waiting at the gateway -> woken from zero."""

from __future__ import annotations

import json

import pytest

from cluster.engines import GATEWAY_METRIC, GATEWAY_PORT
from cluster.session import Cluster
from tests.cluster.workloads import NAMESPACE, inference_deployment, namespace, scaled_object
from tests.support.polling import until_sync

pytestmark = pytest.mark.cluster


@pytest.mark.parametrize("push", [False, True], ids=["polled", "external-push"])
def test_load_up_adds_replicas_and_load_down_removes_them(cluster: Cluster, push: bool) -> None:
    name = "chat-push" if push else "chat"
    cluster.apply(namespace(), inference_deployment(name))
    cluster.apply(scaled_object(name, name, push=push))
    until_sync(lambda: cluster.get("hpa", f"keda-hpa-{name}", "-n", NAMESPACE),
               within=60, what="KEDA made the HPA", tolerate=(AssertionError,))
    # 40 requests in flight, 8 per replica wanted: the HPA goes to 5 (it may take two
    # syncs: without behavior it doubles at most per sync).
    cluster.load(f"{NAMESPACE}/{name}", 40)
    until_sync(lambda: cluster.replicas(NAMESPACE, name) >= 5, within=180,
               what="the real HPA scaled up to 5", every=1.0)
    cluster.load(f"{NAMESPACE}/{name}", 8)
    until_sync(lambda: cluster.replicas(NAMESPACE, name) <= 2, within=180,
               what="the real HPA scaled down", every=1.0)
    cluster.kubectl("delete", "scaledobject", name, "-n", NAMESPACE)
    cluster.kubectl("delete", "deployment", name, "-n", NAMESPACE)


def _demand_source(cluster: Cluster, workload: str) -> str:
    """A demand source on the stand-in gateway's queue for ``workload``, declared in the
    scaler's configuration the way an operator would: a ConfigMap mounted into the scaler
    Deployment and ``--config`` (a JSON patch, as a kustomize overlay applies it)."""
    name = f"gateway-{workload.replace('/', '-')}"
    config = {"demandSources": [{
        "name": name, "kind": "metrics",
        "url": f"http://{cluster.layout.host_pod_ip}:{GATEWAY_PORT}/metrics",
        "metric": GATEWAY_METRIC, "labels": {"workload": workload}}]}
    cluster.apply({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "gpuscale-scaler-config", "namespace": "gpuscale"},
                   "data": {"scaler.yaml": json.dumps(config)}})
    scaler = cluster.get("deployment", "gpuscale-scaler", "-n", "gpuscale")
    pod = scaler["spec"]["template"]["spec"]
    if "--config=/etc/gpuscale/scaler.yaml" not in pod["containers"][0].get("args", []):
        mount = {"name": "scaler-config", "mountPath": "/etc/gpuscale", "readOnly": True}
        volume = {"name": "scaler-config", "configMap": {"name": "gpuscale-scaler-config"}}
        has_mounts = "volumeMounts" in pod["containers"][0]
        patch = [
            {"op": "add", "path": "/spec/template/spec/containers/0/args/-",
             "value": "--config=/etc/gpuscale/scaler.yaml"},
            {"op": "add", "path": "/spec/template/spec/containers/0/volumeMounts"
             + ("/-" if has_mounts else ""), "value": mount if has_mounts else [mount]},
            {"op": "add", "path": "/spec/template/spec/volumes"
             + ("/-" if "volumes" in pod else ""),
             "value": volume if "volumes" in pod else [volume]}]
        cluster.kubectl("patch", "deployment/gpuscale-scaler", "-n", "gpuscale", "--type=json",
                        "-p", json.dumps(patch))
        cluster.kubectl("rollout", "status", "deployment/gpuscale-scaler", "-n", "gpuscale",
                        "--timeout=120s")
    return name


def test_quiet_goes_to_zero_and_demand_wakes_it(cluster: Cluster) -> None:
    """KEDA scales to zero after its cooldown once nothing is active; requests waiting at
    the gateway (no pod to take them) make IsActive true through the demand source, and
    KEDA wakes the workload; the HPA then takes it up to what the load needs."""
    name = "zero-chat"
    source = _demand_source(cluster, f"{NAMESPACE}/{name}")
    cluster.apply(namespace(), inference_deployment(name))
    cluster.apply(scaled_object(name, name, min_replicas=0, cooldown=20,
                                extra={"demandSource": source}))
    cluster.load(f"{NAMESPACE}/{name}", 16)
    until_sync(lambda: cluster.replicas(NAMESPACE, name) >= 2, within=180,
               what="scaled up to 2 on 16 requests in flight", every=1.0)
    cluster.load(f"{NAMESPACE}/{name}", 0)
    until_sync(lambda: cluster.replicas(NAMESPACE, name) == 0, within=240,
               what="KEDA scaled the quiet workload to zero", every=1.0)
    cluster.load(f"{NAMESPACE}/{name}", 24)  # waiting at the gateway: no pod to take them
    until_sync(lambda: cluster.replicas(NAMESPACE, name) >= 1, within=120,
               what="KEDA woke the workload from zero on the gateway's queue", every=1.0)
    until_sync(lambda: cluster.replicas(NAMESPACE, name) >= 3, within=180,
               what="the HPA took it up to what 24 in flight need", every=1.0)
    cluster.kubectl("delete", "scaledobject,deployment", name, "-n", NAMESPACE)
