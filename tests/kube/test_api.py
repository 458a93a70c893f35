"""The Kubernetes seam builds every path itself: names that could move a request elsewhere
are refused before any request, the rest are escaped."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuscale.kube.api import Collection, ObjectRef
from gpuscale.kube.errors import BadReference
from tests.peers.kubeapi import KubeApiPeer, api_client


def test_paths_of_core_and_grouped_objects() -> None:
    assert ObjectRef("apps/v1", "replicasets", "llm", "vllm-7d9").path() == \
        "/apis/apps/v1/namespaces/llm/replicasets/vllm-7d9"
    assert ObjectRef("v1", "pods", "llm", "p", "status").path() == \
        "/api/v1/namespaces/llm/pods/p/status"


@pytest.mark.parametrize(("ref", "why"), [
    (ObjectRef("apps/v1", "deployments", "llm", ".."), "cannot be an object name"),
    (ObjectRef("apps/v1", "deployments", "llm", "../../../deployments"), "cannot be an"),
    (ObjectRef("apps/v1", "deployments", "..", "x"), "cannot be an object name"),
    (ObjectRef("apps/v1", "deployments", "llm", "a%2F.."), "cannot be an object name"),
    (ObjectRef("apps/v1", "deployments", "llm", ""), "1 to 253"),
    (ObjectRef("apps/v1", "deployments", "llm", "x" * 254), "1 to 253"),
    (ObjectRef("../v1", "deployments", "llm", "x"), "apiVersion"),
    (ObjectRef("apps/v1/../..", "deployments", "llm", "x"), "apiVersion"),
    (ObjectRef("apps/v1", "deployments/../pods", "llm", "x"), "resource"),
    (ObjectRef("apps/v1", "deployments", "llm", "x", "scale/../../y"), "subresource"),
])
def test_references_that_could_leave_their_path_are_refused(ref: ObjectRef, why: str) -> None:
    with pytest.raises(BadReference) as info:
        ref.path()
    assert why in str(info.value)


@given(st.text(min_size=1, max_size=80))
def test_any_accepted_name_stays_one_path_segment(name: str) -> None:
    try:
        path = ObjectRef("apps/v1", "deployments", "llm", name).path()
    except BadReference:
        return
    prefix = "/apis/apps/v1/namespaces/llm/deployments/"
    assert path.startswith(prefix)
    assert "/" not in path.removeprefix(prefix)
    assert path.removeprefix(prefix) not in ("", ".", "..")


async def test_unknown_collections_are_refused_and_known_ones_listed() -> None:
    peer = KubeApiPeer()
    await peer.start()
    api = api_client(peer)
    try:
        with pytest.raises(BadReference, match="no watch of nodes"):
            api.list_watch(Collection("v1", "nodes"), "node watch")
        with pytest.raises(BadReference, match="namespace"):
            api.list_watch(Collection("discovery.k8s.io/v1", "endpointslices", "a/b"), "x")
        peer.discovery["example.com/v1"] = [{"name": "inferencesets", "kind": "InferenceSet"},
                                            {"name": "inferencesets/scale", "kind": "Scale"}]
        assert await api.resource_of("example.com/v1", "InferenceSet") == "inferencesets"
        assert await api.resource_of("example.com/v1", "Scale") is None  # a subresource
        with pytest.raises(BadReference, match="kind"):
            await api.resource_of("apps/v1", "Deploy/../ment")
    finally:
        await api.close()
        await peer.stop()
