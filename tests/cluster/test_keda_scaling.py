"""Scenario 1: the real KEDA and the real HPA controller scale a Deployment on the
answers of gpuscale's scaler, itself deployed from our manifests and fed by agents it found
through real EndpointSlices: load rises -> more replicas; load falls -> fewer."""

from __future__ import annotations

import pytest

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
