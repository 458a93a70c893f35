"""Scenario 4: faults under the real KEDA; at no moment does the workload scale below what
its load holds.

- The workload's answer UNAVAILABLE (its engines stop answering while their pods stay
  Ready): KEDA counts the failures, falls back, and ``currentReplicasIfHigher`` keeps the
  replicas that run (more than ``fallback.replicas``); when the engines answer again the
  count follows the load.
- The scaler gone altogether: KEDA cannot fetch the external scaler's metric spec, so its
  fallback never engages (``GetMetricSpecForScalingForScaler`` gets no spec, and
  ``GetMetricsWithFallback`` is only reached for a metric it has a spec of); the HPA,
  unable to read the metric, holds the replicas instead. Once the scaler is back the
  count follows the load again."""

from __future__ import annotations

import time

import pytest

from cluster.session import Cluster
from tests.cluster.workloads import NAMESPACE, inference_deployment, namespace, scaled_object
from tests.support.polling import until_sync

pytestmark = pytest.mark.cluster

FALLBACK = {"failureThreshold": 3, "replicas": 2, "behavior": "currentReplicasIfHigher"}
ENGINE_DOWN = "gpuscale.io/sim-engine-down"


def _scaled_up(cluster: Cluster, name: str, in_flight: int, at_least: int) -> int:
    cluster.apply(namespace(), inference_deployment(name))
    cluster.apply(scaled_object(name, name, fallback=FALLBACK))
    cluster.load(f"{NAMESPACE}/{name}", in_flight)
    until_sync(lambda: cluster.replicas(NAMESPACE, name) >= at_least, within=180,
               what=f"scaled up to {at_least} on {in_flight} requests in flight", every=1.0)
    return cluster.replicas(NAMESPACE, name)


def _never_below(cluster: Cluster, name: str, held: int, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        now = cluster.replicas(NAMESPACE, name)
        assert now >= held, f"{name} went from {held} to {now} replicas while blind"
        time.sleep(2)


def _condition(cluster: Cluster, name: str, kind: str) -> str:
    so = cluster.get("scaledobject", name, "-n", NAMESPACE)
    for c in so.get("status", {}).get("conditions") or []:
        if c.get("type") == kind:
            return str(c.get("status"))
    return ""


def _engines(cluster: Cluster, name: str, down: bool) -> None:
    value = "true" if down else "false"
    cluster.kubectl("annotate", "pods", "-n", NAMESPACE, "-l", f"app={name}", "--overwrite",
                    f"{ENGINE_DOWN}={value}")


def _recovers(cluster: Cluster, name: str) -> None:
    cluster.load(f"{NAMESPACE}/{name}", 0)
    until_sync(lambda: cluster.replicas(NAMESPACE, name) == 1, within=240,
               what="back to 1 replica once gpuscale answers that the load is gone",
               every=1.0)
    cluster.kubectl("delete", "scaledobject", name, "-n", NAMESPACE)
    cluster.kubectl("delete", "deployment", name, "-n", NAMESPACE)


def test_unavailable_answer_falls_back_and_keeps_the_replicas(cluster: Cluster) -> None:
    name = "blind-chat"
    held = _scaled_up(cluster, name, 32, 4)
    _engines(cluster, name, down=True)
    until_sync(lambda: _condition(cluster, name, "Fallback") == "True", within=120,
               what="KEDA fell back on the UNAVAILABLE answers", every=1.0)
    # Nobody can know the load now; it is gone, but the replicas stay.
    cluster.load(f"{NAMESPACE}/{name}", 0)
    _never_below(cluster, name, held, 45)
    _engines(cluster, name, down=False)
    until_sync(lambda: _condition(cluster, name, "Fallback") == "False", within=120,
               what="KEDA left the fallback once the engines answer", every=1.0)
    _recovers(cluster, name)


def test_scaler_gone_the_hpa_holds_the_replicas(cluster: Cluster) -> None:
    name = "orphan-chat"
    held = _scaled_up(cluster, name, 32, 4)
    cluster.kubectl("scale", "deployment/gpuscale-scaler", "-n", "gpuscale", "--replicas=0")
    try:
        cluster.load(f"{NAMESPACE}/{name}", 0)
        _never_below(cluster, name, held, 60)
        assert _condition(cluster, name, "Fallback") != "True"  # see the module's doc
    finally:
        cluster.kubectl("scale", "deployment/gpuscale-scaler", "-n", "gpuscale",
                        "--replicas=2")
    _recovers(cluster, name)
