"""The API-server peer on the wire, read with a plain HTTP client: the quirks of the real
server it promises (tests/peers/README.md) are there, so tests that use it meet them."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tests.peers.kubeapi import PODS, KubeApiPeer, decode_continue, make_pod
from tests.support.polling import until


@pytest.fixture
async def http(kubeapi: KubeApiPeer) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(f"http://127.0.0.1:{kubeapi.port}", headers={
            "Authorization": f"Bearer {kubeapi.token}"}) as session:
        yield session


async def get(http: aiohttp.ClientSession, **query: str) -> tuple[int, dict[str, Any]]:
    async with http.get(PODS, params=query) as r:
        return r.status, await r.json()


async def test_selection_changes_are_added_and_deleted_events(
        kubeapi: KubeApiPeer, http: aiohttp.ClientSession) -> None:
    kubeapi.add(make_pod("llm", "p", "u1", labels={"tier": "gpu"}))
    kubeapi.add(make_pod("llm", "q", "u2", labels={"tier": "cpu"}))
    _, listed = await get(http, labelSelector="tier=gpu")
    rv = listed["metadata"]["resourceVersion"]
    async with http.get(PODS, params={"watch": "true", "resourceVersion": rv,
                                      "labelSelector": "tier=gpu"}) as r:
        await until(lambda: kubeapi.watching)
        kubeapi.modify(make_pod("llm", "p", "u1", labels={"tier": "cpu"}, ip="10.9.9.9"))
        kubeapi.modify(make_pod("llm", "q", "u2", labels={"tier": "gpu"}))
        gone = json.loads(await r.content.readline())
        came = json.loads(await r.content.readline())
    assert gone["type"] == "DELETED"
    # the previous content, at the version of the change that took it out of the selection
    assert gone["object"]["metadata"]["labels"] == {"tier": "gpu"}
    assert gone["object"]["status"]["podIP"] == "10.0.0.1"
    assert int(gone["object"]["metadata"]["resourceVersion"]) == int(rv) + 1
    assert (came["type"], came["object"]["metadata"]["name"]) == ("ADDED", "q")


async def test_pages_in_key_order_and_a_possibly_empty_last_page(
        kubeapi: KubeApiPeer, http: aiohttp.ClientSession) -> None:
    for name in ("c", "a", "b"):
        kubeapi.add(make_pod("llm", name, f"u-{name}"))
    kubeapi.add(make_pod("zz", "other", "u-z", node="node-b"))
    _, first = await get(http, limit="2")
    assert [p["metadata"]["name"] for p in first["items"]] == ["a", "b"]
    assert first["metadata"]["remainingItemCount"] == 2
    _, rest = await get(http, limit="2", **{"continue": first["metadata"]["continue"]})
    assert [p["metadata"]["name"] for p in rest["items"]] == ["c", "other"]
    assert "continue" not in rest["metadata"]
    # With a selector: full pages while keys remain, no remainingItemCount, and the page
    # after the last match can be empty.
    _, first = await get(http, limit="3", fieldSelector="spec.nodeName=node-a")
    assert "remainingItemCount" not in first["metadata"]
    assert len(first["items"]) == 3
    _, last = await get(http, limit="3", fieldSelector="spec.nodeName=node-a",
                        **{"continue": first["metadata"]["continue"]})
    assert last["items"] == []
    assert "continue" not in last["metadata"]


async def test_pages_are_read_at_the_first_page_s_version(
        kubeapi: KubeApiPeer, http: aiohttp.ClientSession) -> None:
    for name in "abcd":
        kubeapi.add(make_pod("llm", name, f"u-{name}"))
    _, first = await get(http, limit="2")
    kubeapi.delete("u-d")
    kubeapi.add(make_pod("llm", "e", "u-e"))
    _, rest = await get(http, limit="2", **{"continue": first["metadata"]["continue"]})
    assert [p["metadata"]["name"] for p in rest["items"]] == ["c", "d"]
    assert rest["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    kubeapi.compact()  # now the snapshot is gone: 410 Expired, and an inconsistent token
    code, expired = await get(http, limit="2", **{"continue": first["metadata"]["continue"]})
    assert (code, expired["kind"], expired["reason"]) == (410, "Status", "Expired")
    assert "too old to display a consistent list result" in expired["message"]
    assert decode_continue(expired["metadata"]["continue"])[0] == -1
    _, latest = await get(http, limit="5", **{"continue": expired["metadata"]["continue"]})
    assert [p["metadata"]["name"] for p in latest["items"]] == ["c", "e"]


@pytest.mark.parametrize(("query", "why"), [
    ({"labelSelector": "x in (a"}, "unable to parse requirement"),
    ({"fieldSelector": "spec.hostname=a"}, "field label not supported: spec.hostname"),
    ({"continue": "bm90IGEgdG9rZW4"}, "invalid continue token"),
])
async def test_requests_the_server_refuses(http: aiohttp.ClientSession,
                                           query: dict[str, str], why: str) -> None:
    code, body = await get(http, **query)
    assert (code, body["kind"], body["reason"]) == (400, "Status", "BadRequest")
    assert why in body["message"]


async def test_bookmarks_only_for_watches_that_ask(kubeapi: KubeApiPeer,
                                                   http: aiohttp.ClientSession) -> None:
    kubeapi.bookmark_every = 0.02
    watch = {"watch": "true", "resourceVersion": str(kubeapi.rv)}
    async with http.get(PODS, params={**watch, "allowWatchBookmarks": "true"}) as asked, \
            http.get(PODS, params={**watch, "timeoutSeconds": "1"}) as silent:
        kubeapi.add(make_pod("other", "p", "u1", node="node-b"))
        for _ in range(3):
            line = json.loads(await asked.content.readline())
            if line["type"] == "BOOKMARK":
                break
        assert line == {"type": "BOOKMARK", "object": {
            "kind": "Pod", "apiVersion": "v1",
            "metadata": {"resourceVersion": str(kubeapi.rv), "creationTimestamp": None}}}
        assert all(json.loads(raw)["type"] != "BOOKMARK"
                   for raw in (await silent.read()).splitlines())


SAR = "/apis/authorization.k8s.io/v1/subjectaccessreviews"


@pytest.mark.parametrize(("body", "code", "words"), [
    ({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
      "spec": {"user": "u", "resourceAttributes": {"verb": "get"}}}, 201, ""),
    ({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
      "spec": {"user": "u"}}, 422, "exactly one of nonResourceAttributes"),
    ({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
      "spec": {"nonResourceAttributes": {"path": "/x", "verb": "get"}}}, 422,
     "at least one of user or group"),
    ({"kind": "Pod"}, 400, "not a SubjectAccessReview"),
])
async def test_subject_access_reviews_as_the_real_endpoint(
        kubeapi: KubeApiPeer, http: aiohttp.ClientSession, body: dict[str, Any], code: int,
        words: str) -> None:
    kubeapi.authorize = lambda spec: (True, False, "RBAC: allowed")
    async with http.post(SAR, json=body) as r:
        got = await r.json()
        assert r.status == code
    if code == 201:
        assert got["status"] == {"allowed": True, "reason": "RBAC: allowed"}
        assert got["spec"] == body["spec"]
    else:
        assert (got["kind"], got["code"]) == ("Status", code)
        assert words in got["message"]
