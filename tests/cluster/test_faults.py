"""Scenario 4: faults under the real KEDA. With the scaler gone, KEDA's fallback with
``currentReplicasIfHigher`` (what the README recommends) holds the replicas the workload
had - never fewer than its load needs - and once the scaler is back the count follows the
load again."""

from __future__ import annotations

import time

import pytest

from tests.cluster.conftest import Cluster
from tests.cluster.workloads import NAMESPACE, inference_deployment, namespace, scaled_object
from tests.support.polling import until_sync

pytestmark = pytest.mark.cluster

FALLBACK = {"failureThreshold": 3, "replicas": 2, "behavior": "currentReplicasIfHigher"}


def _scaler_replicas(cluster: Cluster, n: int) -> None:
    cluster.kubectl("scale", "deployment/gpuscale-scaler", "-n", "gpuscale", f"--replicas={n}")


def test_scaler_stopped_fallback_holds_the_count_then_recovery(cluster: Cluster) -> None:
    name = "fault-chat"
    cluster.apply(namespace(), inference_deployment(name))
    cluster.apply(scaled_object(name, name, fallback=FALLBACK))
    cluster.load(f"{NAMESPACE}/{name}", 32)
    until_sync(lambda: cluster.replicas(NAMESPACE, name) >= 4, within=180,
               what="scaled up to 4 on 32 requests in flight", every=1.0)
    held = cluster.replicas(NAMESPACE, name)
    _scaler_replicas(cluster, 0)
    try:
        until_sync(lambda: _condition(cluster, name, "Fallback") == "True", within=120,
                   what="KEDA fell back", every=1.0)
        # The load is gone too, but nobody can know it: for a minute of fallback the
        # replicas stay where they were (fallback.replicas is 2, fewer than run).
        cluster.load(f"{NAMESPACE}/{name}", 0)
        end = time.monotonic() + 60
        while time.monotonic() < end:
            assert cluster.replicas(NAMESPACE, name) >= held
            time.sleep(2)
    finally:
        _scaler_replicas(cluster, 2)
    until_sync(lambda: cluster.replicas(NAMESPACE, name) == 1, within=240,
               what="back to 1 replica once the scaler answers that the load is gone",
               every=1.0)
    cluster.kubectl("delete", "scaledobject", name, "-n", NAMESPACE)
    cluster.kubectl("delete", "deployment", name, "-n", NAMESPACE)


def _condition(cluster: Cluster, name: str, kind: str) -> str:
    so = cluster.get("scaledobject", name, "-n", NAMESPACE)
    for c in so.get("status", {}).get("conditions") or []:
        if c.get("type") == kind:
            return str(c.get("status"))
    return ""
