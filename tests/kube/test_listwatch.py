"""ListWatch against the API-server peer: selectors seen the way the watch cache applies
them, bookmarks on a quiet watch, paginated lists, and every hostile reply turned into a
logged, retried error - never an exception out of ``run``."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest
from aiohttp import web

from gpuscale.kube.api import Collection, KubeApi
from gpuscale.kube.listwatch import INACTIVITY_S, LIST_RESTARTS, ListWatch
from tests.peers.kubeapi import KubeApiPeer, api_client, make_pod, status
from tests.support.polling import until

PODS = Collection("v1", "pods")


class Watched:
    """A running ListWatch over the peer; on leaving, ``run`` must still be running."""

    def __init__(self, peer: KubeApiPeer, collection: Collection = PODS,
                 **options: Any) -> None:
        self.api: KubeApi = api_client(peer)
        options.setdefault("backoff_s", (0.05, 0.1))
        self.lw: ListWatch = self.api.list_watch(collection, "test watch", **options)
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> ListWatch:
        self.task = asyncio.create_task(self.lw.run())
        return self.lw

    async def __aexit__(self, *_: object) -> None:
        assert self.task is not None
        if self.task.done():
            self.task.result()  # what escaped run(), as the failure
            pytest.fail("run() ended")
        self.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await self.task
        await self.api.close()


def names(lw: ListWatch) -> set[str]:
    return {o["metadata"]["name"] for o in lw.items.values()}


def warned(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    return any(text in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


def pod(name: str, **kw: Any) -> dict[str, Any]:
    return make_pod("llm", name, f"u-{name}", **kw)


# -- selectors: leaving and joining a watch -------------------------------------------


async def test_objects_leave_and_join_a_label_selected_watch(kubeapi: KubeApiPeer) -> None:
    sel = "app==vllm,tier in (gpu,big-gpu),!canary,zone notin (eu),team,env!=prod"
    base = {"app": "vllm", "team": "t"}
    kubeapi.add(pod("a", labels={**base, "tier": "gpu"}))
    kubeapi.add(pod("b", labels={**base, "tier": "cpu"}))
    kubeapi.add(pod("c", labels={**base, "tier": "gpu", "canary": ""}))
    kubeapi.add(pod("d", labels={**base, "tier": "big-gpu", "zone": "us", "env": "dev"}))
    kubeapi.add(pod("e", labels={**base, "tier": "gpu", "zone": "eu"}))
    kubeapi.add(pod("f", labels={"app": "vllm", "tier": "gpu"}))
    kubeapi.add(pod("g", labels={**base, "tier": "gpu", "env": "prod"}))
    async with Watched(kubeapi, Collection("v1", "pods", label_selector=sel)) as lw:
        await until(lambda: names(lw) == {"a", "d"} and kubeapi.watching)
        kubeapi.modify(pod("a", labels={**base, "tier": "cpu"}))  # leaves: DELETED
        kubeapi.modify(pod("b", labels={**base, "tier": "gpu"}))  # joins: ADDED
        kubeapi.modify(pod("d", labels={**base, "tier": "big-gpu", "zone": "eu"}))
        kubeapi.modify(pod("g", labels={**base, "tier": "gpu", "env": "dev"}))
        await until(lambda: names(lw) == {"b", "g"}, what="a and d gone, b and g there")
        kubeapi.modify(pod("a", labels={**base, "tier": "big-gpu"}))
        await until(lambda: names(lw) == {"a", "b", "g"})
        assert kubeapi.lists == 1


async def test_pods_that_finish_leave_a_phase_selected_watch(kubeapi: KubeApiPeer) -> None:
    sel = ("spec.nodeName=node-a,metadata.namespace==llm,status.phase!=Succeeded,"
           "status.phase!=Failed")
    kubeapi.add(pod("run", phase="Running"))
    kubeapi.add(pod("wait", phase="Pending"))
    kubeapi.add(pod("done", phase="Succeeded"))
    kubeapi.add(pod("away", node="node-b"))
    kubeapi.add(make_pod("other", "p", "u-other"))
    async with Watched(kubeapi, Collection("v1", "pods", field_selector=sel)) as lw:
        await until(lambda: names(lw) == {"run", "wait"} and kubeapi.watching)
        kubeapi.modify(pod("run", phase="Failed"))
        kubeapi.modify(pod("wait", phase="Running"))
        await until(lambda: names(lw) == {"wait"})
        kubeapi.delete("u-done")  # never seen by this watch: nothing to hear
        kubeapi.modify(pod("done2", phase="Running"))
        await until(lambda: names(lw) == {"wait", "done2"})
        assert kubeapi.lists == 1


# -- bookmarks -------------------------------------------------------------------------


async def test_a_quiet_watch_with_bookmarks_is_neither_reconnected_nor_relisted(
        kubeapi: KubeApiPeer) -> None:
    # The real server bookmarks about once a minute, inside our inactivity timeout.
    every = KubeApiPeer().bookmark_every
    assert every is not None
    assert every < INACTIVITY_S
    kubeapi.bookmark_every = 0.05
    sel = "spec.nodeName=node-a"
    async with Watched(kubeapi, Collection("v1", "pods", field_selector=sel),
                       inactivity_s=0.5) as lw:
        await until(lambda: kubeapi.watching)
        for i in range(3):  # changes this watch does not see move the version on
            kubeapi.add(pod(f"b{i}", node="node-b"))
        sent = kubeapi.bookmarks_sent
        await until(lambda: kubeapi.bookmarks_sent >= sent + 40, what="40 bookmarks, 4 "
                    "inactivity timeouts' worth")
        assert (kubeapi.watches, kubeapi.lists, lw.relists) == (1, 1, 0)
        # The bookmarks carried the server's version: history can go and a dropped watch
        # still resumes where it was.
        kubeapi.compact()
        await kubeapi.drop_watches()
        kubeapi.add(pod("late"))
        await until(lambda: names(lw) == {"late"})
        assert (kubeapi.lists, lw.relists) == (1, 0)


async def test_a_quiet_watch_without_bookmarks_is_relisted(kubeapi: KubeApiPeer) -> None:
    """The other side of the test above: what bookmarks spare the client."""
    kubeapi.bookmark_every = None
    async with Watched(kubeapi, inactivity_s=0.3):
        await until(lambda: kubeapi.lists >= 2, what="a relist after repeated timeouts")
        assert kubeapi.watches > 2
        assert kubeapi.bookmarks_sent == 0


# -- paginated lists -------------------------------------------------------------------


async def test_lists_are_read_page_by_page_to_the_end(kubeapi: KubeApiPeer) -> None:
    for i in range(10):
        kubeapi.add(pod(f"a{i:02d}"))
    for i in range(5):  # after the last match in key order: the last page comes back empty
        kubeapi.add(pod(f"b{i:02d}", node="node-b"))
    sel = Collection("v1", "pods", field_selector="spec.nodeName=node-a")
    async with Watched(kubeapi, sel, page_size=5) as lw:
        await until(lambda: lw.synced_at is not None)
        assert names(lw) == {f"a{i:02d}" for i in range(10)}
        assert (kubeapi.lists, kubeapi.list_pages) == (1, 3)
        await until(lambda: kubeapi.watching)
        kubeapi.add(pod("new"))
        await until(lambda: "new" in names(lw))


async def test_a_list_larger_than_max_items_is_an_error_not_a_truncation(
        kubeapi: KubeApiPeer, caplog: pytest.LogCaptureFixture) -> None:
    for i in range(12):
        kubeapi.add(pod(f"p{i:02d}"))
    async with Watched(kubeapi, page_size=5, max_items=10) as lw:
        await until(lambda: warned(caplog, "more than 10 items"))
        assert lw.synced_at is None
        assert lw.state() == (False, "more than 10 items")


async def test_an_expired_continue_token_starts_the_list_over(
        kubeapi: KubeApiPeer, caplog: pytest.LogCaptureFixture) -> None:
    for i in range(7):
        kubeapi.add(pod(f"p{i}"))
    expired: list[str] = []

    def compact_while_paging(request: web.Request) -> None:
        if request.query.get("continue") and not expired:
            expired.append(request.query["continue"])
            kubeapi.delete("u-p0")  # the first page is out of date now...
            kubeapi.add(pod("late"))
            kubeapi.compact()  # ...and its snapshot gone

    kubeapi.on_list_page = compact_while_paging
    async with Watched(kubeapi, page_size=3) as lw:
        await until(lambda: lw.synced_at is not None)
        assert names(lw) == {f"p{i}" for i in range(1, 7)} | {"late"}
        assert (lw.list_restarts, kubeapi.lists, lw.relists) == (1, 2, 0)
        assert not warned(caplog, "")


async def test_continue_tokens_that_always_expire_back_off_then_recover(
        kubeapi: KubeApiPeer, caplog: pytest.LogCaptureFixture) -> None:
    for i in range(4):
        kubeapi.add(pod(f"p{i}"))

    def compact(request: web.Request) -> None:
        if request.query.get("continue"):
            kubeapi.modify(pod("p0"))  # a write, then the snapshot being paged is gone
            kubeapi.compact()

    kubeapi.on_list_page = compact
    async with Watched(kubeapi, page_size=2) as lw:
        await until(lambda: warned(caplog, f"expired {LIST_RESTARTS + 1} times in a row"),
                    what="the list given up for now")
        assert lw.synced_at is None
        kubeapi.on_list_page = None
        await until(lambda: names(lw) == {f"p{i}" for i in range(4)})
        assert lw.state() == (True, "ok")


# -- hostile replies -------------------------------------------------------------------

UID_LESS = {"metadata": {"name": "x"}}


def list_body(items: Any, **meta: Any) -> bytes:
    return json.dumps({"kind": "PodList", "metadata": {"resourceVersion": "1", **meta},
                       "items": items}).encode()


def event(kind: Any, obj: Any) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode() + b"\n"


HOSTILE_LISTS = {
    "html from a proxy": (502, b"<html>Bad Gateway</html>", "API error 502: Bad Gateway"),
    "not JSON": (200, b"<html>ok</html>", "is not JSON"),
    "not an object": (200, b"[]", "not a JSON object but list"),
    "items not a list": (200, list_body({"p": {}}), "items are not a list"),
    "an item not an object": (200, list_body([1]), "list item 0 is not an object"),
    "an item without uid": (200, list_body([UID_LESS]), "list item 0 has no metadata.uid"),
    "a continue that is no string": (200, list_body([], **{"continue": 7}),
                                     "metadata.continue is not a string"),
    "no resourceVersion": (200, json.dumps({"items": [], "metadata": {}}).encode(),
                           "no metadata.resourceVersion"),
    "a Status error": (500, json.dumps(status(500, "InternalError",
                                              "etcdserver: request timed out")).encode(),
                       "API error 500: etcdserver: request timed out"),
}


@pytest.mark.parametrize("case", list(HOSTILE_LISTS))
async def test_hostile_list_replies_are_logged_and_retried(
        kubeapi: KubeApiPeer, caplog: pytest.LogCaptureFixture, case: str) -> None:
    code, body, why = HOSTILE_LISTS[case]
    kubeapi.add(pod("a"))
    kubeapi.next_list_replies.append((code, body))
    async with Watched(kubeapi) as lw:
        await until(lambda: warned(caplog, why), what=f"a warning saying {why!r}")
        await until(lambda: names(lw) == {"a"} and lw.state() == (True, "ok"))


HOSTILE_WATCHES = {
    "not JSON": (b"{not json\n", "a watch line is not JSON"),
    "nested too deep": (b"[" * 4000 + b"\n", "a watch line is not JSON"),
    "not an object": (b"[1]\n", "a watch line is not an event"),
    "no type": (b'{"object": {"metadata": {"uid": "u"}}}\n', "no known type"),
    "a type that is a number": (event(1, {"metadata": {"uid": "u"}}), "no known type"),
    "an object that is a string": (event("ADDED", "pod"), "ADDED event has no object"),
    "an object without uid": (event("MODIFIED", UID_LESS), "has no metadata.uid"),
    "a bookmark without version": (event("BOOKMARK", {"metadata": {}}), "BOOKMARK without"),
    "an ERROR without Status": (event("ERROR", {"message": "?"}), "ERROR event without"),
    "an ERROR 500": (event("ERROR", status(500, "InternalError", "etcdserver: leader "
                                                                  "changed")),
                     "the watch failed: 500 InternalError: etcdserver: leader changed"),
    "an event over the bound": (event("ADDED", {"metadata": {"uid": "u"}, "x": "y" * 5000}),
                                "a watch event over 4096 bytes"),
    "a line that never ends": (b'{"type": "ADDED", "object": ' + b" " * 9000,
                               "a watch event over 4096 bytes"),
}


@pytest.mark.parametrize("case", list(HOSTILE_WATCHES))
async def test_hostile_watch_lines_are_logged_and_relisted(
        kubeapi: KubeApiPeer, caplog: pytest.LogCaptureFixture, case: str) -> None:
    body, why = HOSTILE_WATCHES[case]
    kubeapi.add(pod("a"))
    kubeapi.next_watch_bodies.append(body)
    async with Watched(kubeapi, max_event_bytes=4096) as lw:
        await until(lambda: warned(caplog, why), what=f"a warning saying {why!r}")
        await until(lambda: kubeapi.lists >= 2 and kubeapi.watching)
        kubeapi.add(pod("b"))
        await until(lambda: names(lw) == {"a", "b"} and lw.state() == (True, "ok"))


async def test_a_hostile_line_in_an_open_watch(kubeapi: KubeApiPeer,
                                               caplog: pytest.LogCaptureFixture) -> None:
    async with Watched(kubeapi) as lw:
        await until(lambda: kubeapi.watching)
        kubeapi.add(pod("a"))
        await until(lambda: names(lw) == {"a"})
        kubeapi.send_raw(event("ADDED", [1, 2]))
        await until(lambda: warned(caplog, "ADDED event has no object"))
        kubeapi.add(pod("b"))
        await until(lambda: names(lw) == {"a", "b"} and lw.state() == (True, "ok"))


async def test_an_error_410_relists_without_a_warning(
        kubeapi: KubeApiPeer, caplog: pytest.LogCaptureFixture) -> None:
    kubeapi.add(pod("a"))
    async with Watched(kubeapi) as lw:
        await until(lambda: kubeapi.watching)
        kubeapi.send_raw(event("ERROR", status(410, "Expired", "too old resource version")))
        await until(lambda: lw.relists == 1 and kubeapi.lists == 2)
        assert not warned(caplog, "")


async def test_a_stream_cut_inside_an_event_resumes_without_relisting(
        kubeapi: KubeApiPeer, caplog: pytest.LogCaptureFixture) -> None:
    kubeapi.next_watch_bodies.append(b'{"type": "ADDED", "object": {"metadata": {"ui')
    async with Watched(kubeapi) as lw:
        await until(lambda: kubeapi.watches >= 2 and kubeapi.watching)
        kubeapi.add(pod("a"))
        await until(lambda: names(lw) == {"a"})
        assert (kubeapi.lists, lw.relists) == (1, 0)
        assert not warned(caplog, "")


async def test_a_server_that_expires_every_watch_is_not_relisted_in_a_hot_loop(
        kubeapi: KubeApiPeer, caplog: pytest.LogCaptureFixture) -> None:
    kubeapi.add(pod("a"))
    expired = event("ERROR", status(410, "Expired", "too old resource version"))
    kubeapi.next_watch_bodies.extend([expired] * 4)
    async with Watched(kubeapi) as lw:
        await until(lambda: warned(caplog, "expired again right after a relist (410)"))
        await until(lambda: not kubeapi.next_watch_bodies and kubeapi.watching)
        kubeapi.add(pod("b"))
        await until(lambda: names(lw) == {"a", "b"} and lw.state() == (True, "ok"))
        assert lw.relists == 4
