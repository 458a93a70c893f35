"""Scenario 5: GPUs from ResourceClaims (DRA). On ``kwok-dra-0`` no device plugin runs: a
fake NVIDIA DRA driver publishes its GPUs in a ResourceSlice, the real kube-scheduler
allocates each replica's claim (from a ResourceClaimTemplate) against it, the stand-in
kubelet lists the claims in PodResources' ``dynamic_resources`` and runs each pod's
simulated process on the GPU allocated; the node's agent names the devices from the slice.

- The same workload on the device plugin and on claims, under the same load, gets the
  same value from gpuscale's GetMetrics as KEDA reads it (its external metrics API).
- With the node's slice missing, GetMetrics is UNAVAILABLE naming each pod's claim (and
  KEDA gets no number at all), never a smaller sum; the slice back, the value is back.
- ``gpuscale top`` shows each of the node's GPUs held by its pod with the pod's claim.
- KEDA scales a claim workload up and down; each new replica gets a GPU of its own."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.parse

import grpc
import pytest

from cluster import dra, nodes
from cluster.session import Cluster
from gpuscale.proto import externalscaler_pb2 as pb
from gpuscale.proto import externalscaler_pb2_grpc as pb_grpc
from gpuscale.stream.records import held_by
from tests.cluster.workloads import (
    NAMESPACE,
    gpu_claim_template,
    inference_deployment,
    namespace,
    scaled_object,
)
from tests.support.polling import until_sync

pytestmark = pytest.mark.cluster

METRIC = "s0-gpuscale-gpu-utilization"
DRA_NODE = next(s for s in nodes.DEFAULT_NODES if s.dra)


def _workload(cluster: Cluster, name: str, *, dra_gpus: bool, replicas: int,
              max_replicas: int) -> None:
    cluster.apply(inference_deployment(name, replicas, dra=dra_gpus))
    cluster.apply(scaled_object(name, name, signal="gpu-utilization", target_value="50",
                                min_replicas=replicas, max_replicas=max_replicas))


def _keda_value(cluster: Cluster, name: str) -> float | None:
    """What KEDA's external metrics API (through the aggregator) serves for the
    ScaledObject: the value KEDA got from gpuscale's GetMetrics; None when it got none."""
    selector = urllib.parse.quote(f"scaledobject.keda.sh/name={name}")
    out = cluster.kubectl("get", "--raw", f"/apis/external.metrics.k8s.io/v1beta1/namespaces/"
                          f"{NAMESPACE}/{METRIC}?labelSelector={selector}", check=False)
    if not out:
        return None
    (item,) = json.loads(out)["items"]
    q = str(item["value"])
    return float(q[:-1]) / 1000 if q.endswith("m") else float(q)


def _scaler(cluster: Cluster) -> str:
    pods = cluster.get("pods", "-n", "gpuscale", "-l", "app.kubernetes.io/component=scaler")
    ip = next(p["status"]["podIP"] for p in pods["items"]
              if p["status"].get("phase") == "Running" and p["status"].get("podIP"))
    return f"{ip}:6000"


def _get_metrics(cluster: Cluster, name: str) -> tuple[grpc.StatusCode, str]:
    """GetMetrics asked of a scaler pod as KEDA asks it: (OK, value) or (code, details)."""
    so = cluster.get("scaledobject", name, "-n", NAMESPACE)
    ref = pb.ScaledObjectRef(name=name, namespace=NAMESPACE,
                             scalerMetadata=so["spec"]["triggers"][0]["metadata"])
    with grpc.insecure_channel(_scaler(cluster)) as channel:
        try:
            got = pb_grpc.ExternalScalerStub(channel).GetMetrics(
                pb.GetMetricsRequest(scaledObjectRef=ref, metricName=METRIC), timeout=10)
        except grpc.RpcError as exc:
            return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, str(got.metricValues[0].metricValueFloat)


def _top_holders(cluster: Cluster) -> set[str]:
    """Who holds each of the DRA node's GPUs, as ``gpuscale top --json`` shows it."""
    done = subprocess.run([sys.executable, "-m", "gpuscale.cli", "top", "--scaler",
                           _scaler(cluster), "--json", "--node", DRA_NODE.name],
                          capture_output=True, text=True, timeout=60, check=True)
    return {h for n in json.loads(done.stdout).get("nodes") or []
            for d in n.get("devices") or [] for h in held_by(d.get("pods") or [],
                                                             d.get("claims") or [])}


def _claims_of(cluster: Cluster, app: str) -> list[str]:
    pods = cluster.get("pods", "-n", NAMESPACE, "-l", f"app={app}")["items"]
    return [s["resourceClaimName"] for p in pods
            for s in p["status"].get("resourceClaimStatuses") or []]


def _allocated(cluster: Cluster, claims: list[str]) -> list[tuple[str, str, str]]:
    out = []
    for name in claims:
        claim = cluster.get("resourceclaim", name, "-n", NAMESPACE)
        for r in claim["status"]["allocation"]["devices"]["results"]:
            out.append((r["driver"], r["pool"], r["device"]))
    return out


def test_claims_give_the_device_plugins_value_and_a_missing_slice_is_unavailable(
        cluster: Cluster) -> None:
    cluster.apply(namespace(), gpu_claim_template())
    _workload(cluster, "plugin-chat", dra_gpus=False, replicas=2, max_replicas=2)
    _workload(cluster, "claim-chat", dra_gpus=True, replicas=2, max_replicas=2)
    for name in ("plugin-chat", "claim-chat"):
        cluster.load(f"{NAMESPACE}/{name}", 16)  # 8 running of 16 per replica: 50 % each
    until_sync(lambda: (_keda_value(cluster, "plugin-chat"), _keda_value(cluster, "claim-chat"))
               == (100.0, 100.0), within=180, every=2.0,
               what="KEDA reads 100 for both workloads (2 replicas at 50 %)")
    claims = _claims_of(cluster, "claim-chat")
    assert len(claims) == 2
    devices = _allocated(cluster, claims)  # the real scheduler's choice, one GPU each
    assert len(set(devices)) == 2
    assert {d[:2] for d in devices} == {(dra.DRIVER, DRA_NODE.name)}
    pods = cluster.get("pods", "-n", NAMESPACE, "-l", "app=claim-chat")["items"]
    want = {f"{NAMESPACE}/{p['metadata']['name']} (claim "
            f"{p['status']['resourceClaimStatuses'][0]['resourceClaimName']})" for p in pods}
    until_sync(lambda: _top_holders(cluster) == want, within=60, every=2.0,
               what="gpuscale top shows each GPU's holder with its claim")

    cluster.kubectl("delete", "resourceslice", dra.slice_name(DRA_NODE))
    try:
        def unavailable() -> str:
            code, details = _get_metrics(cluster, "claim-chat")
            assert code is grpc.StatusCode.UNAVAILABLE, (code, details)
            return details
        details = until_sync(unavailable, within=60, every=2.0, tolerate=(AssertionError,),
                             what="GetMetrics UNAVAILABLE once the slice is gone")
        for claim in claims:
            assert f"{NAMESPACE}/{claim}" in details, details
        assert "no ResourceSlice" in details, details
        assert _keda_value(cluster, "claim-chat") is None  # KEDA got no number at all
        assert _keda_value(cluster, "plugin-chat") == 100.0
    finally:
        cluster.apply(dra.resource_slice(DRA_NODE))
    until_sync(lambda: _keda_value(cluster, "claim-chat") == 100.0, within=120, every=2.0,
               what="the value is back with the slice")
    cluster.kubectl("delete", "scaledobject,deployment", "plugin-chat", "claim-chat", "-n",
                    NAMESPACE)


def test_keda_scales_a_workload_whose_gpus_come_from_claims(cluster: Cluster) -> None:
    name = "claim-scale"
    cluster.apply(namespace(), gpu_claim_template())
    _workload(cluster, name, dra_gpus=True, replicas=1, max_replicas=6)
    # 40 in flight at 16 per replica: gpu-utilization sums to 250 whatever the replica
    # count, 50 wanted per replica -> 5.
    cluster.load(f"{NAMESPACE}/{name}", 40)
    until_sync(lambda: cluster.replicas(NAMESPACE, name) >= 5, within=240, every=1.0,
               what="KEDA scaled the claim workload up to 5")
    until_sync(lambda: len(_claims_of(cluster, name)) >= 5, within=60, every=1.0,
               what="each replica's claim made")
    devices = until_sync(lambda: _allocated(cluster, _claims_of(cluster, name)), within=60,
                         every=1.0, tolerate=(KeyError, AssertionError, subprocess.SubprocessError),
                         what="each claim allocated")
    assert len(set(devices)) == len(devices)  # a GPU of its own each
    cluster.load(f"{NAMESPACE}/{name}", 8)
    until_sync(lambda: cluster.replicas(NAMESPACE, name) <= 2, within=240, every=1.0,
               what="KEDA scaled the claim workload down")
    cluster.kubectl("delete", "scaledobject,deployment", name, "-n", NAMESPACE)
