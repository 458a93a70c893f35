"""Who may read custom.metrics.k8s.io: client certificates of the cluster CA, the
aggregator's front proxy speaking for a user in its headers, what is not authenticated;
delegated authorization by SubjectAccessReview (cached, refused when it fails); and the
trust ConfigMap the server waits for (missing, or unreadable for want of RBAC)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gpuscale.metrics_api.answers import MetricAnswers
from gpuscale.metrics_api.authz import Authorizer
from gpuscale.metrics_api.main import configmap_reader
from gpuscale.metrics_api.server import MetricsApiServer, TrustSource
from gpuscale.scaler.answers import Answers
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.scaler.state.plan_book import PlanBook
from tests.metrics_api.https_cluster import V1B2, Cluster, write_certs
from tests.peers.kubeapi import KubeApiPeer, api_client
from tests.support.polling import until

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


async def test_client_certificate_users_are_authenticated_users(cluster: Cluster) -> None:
    """RBAC bound to system:authenticated (discovery, a readers' group) applies to a
    client certificate's user too, as kube-apiserver adds the group to everyone it knows."""
    await cluster.get(f"{V1B2}/namespaces/llm/pods/*/gpu_utilization", "bob")
    assert cluster.peer.reviews[-1]["groups"] == ["system:authenticated"]


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


# -- the trust ConfigMap ---------------------------------------------------------------------------


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
