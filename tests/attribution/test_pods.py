"""The node pod cache against a test API server speaking the list/watch wire format."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given

from gpuscale.attribution.model import OwnerRef, PodInfo, PodPhase
from gpuscale.attribution.pods import NodePodCache, pod_info
from gpuscale.telemetry.model import Absent
from tests.peers.kubeapi import KubeApiPeer, api_client, make_pod
from tests.support.polling import until
from tests.support.strategies import json_values


class Running:
    def __init__(self, kubeapi: KubeApiPeer, **kw: object) -> None:
        self.api = api_client(kubeapi, kw.pop("token", None))  # type: ignore[arg-type]
        self.cache = NodePodCache(self.api, "node-a", backoff_s=(0.05, 0.1),
                                  **kw)  # type: ignore[arg-type]
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> NodePodCache:
        self.task = asyncio.create_task(self.cache.run())
        return self.cache

    async def __aexit__(self, *_: object) -> None:
        assert self.task is not None
        self.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await self.task
        await self.api.close()


def names(cache: NodePodCache) -> set[str]:
    pods = cache.pods()
    assert not isinstance(pods, Absent)
    return {name for _, name in pods}


def get(cache: NodePodCache, name: str) -> PodInfo:
    pods = cache.pods()
    assert not isinstance(pods, Absent)
    return pods[("llm", name)]


async def test_list_then_watch_adds_modifies_deletes(kubeapi: KubeApiPeer) -> None:
    kubeapi.add(make_pod("llm", "a", "uid-a"))
    kubeapi.add(make_pod("llm", "elsewhere", "uid-x", node="node-b"))
    async with Running(kubeapi) as cache:
        await until(lambda: not isinstance(cache.pods(), Absent))
        assert names(cache) == {"a"}
        kubeapi.add(make_pod("llm", "b", "uid-b", ready=False))
        await until(lambda: names(cache) == {"a", "b"})
        assert get(cache, "b").ready is False
        kubeapi.modify(make_pod("llm", "b", "uid-b", ready=True, ip="10.0.0.9"))
        await until(lambda: get(cache, "b").ready)
        assert get(cache, "b").ip == "10.0.0.9"
        kubeapi.delete("uid-a")
        await until(lambda: names(cache) == {"b"})
        assert kubeapi.lists == 1
        assert cache.state() == (True, "ok")


async def test_owner_chain_to_the_workload(kubeapi: KubeApiPeer) -> None:
    kubeapi.add_owner("replicasets", "llm", "vllm-7d9f", ("Deployment", "vllm"))
    kubeapi.add_owner("jobs", "llm", "nightly-2911", ("CronJob", "nightly"))
    kubeapi.add(make_pod("llm", "vllm-7d9f-x", "u1", owner=("ReplicaSet", "vllm-7d9f")))
    kubeapi.add(make_pod("llm", "train-0", "u2", owner=("StatefulSet", "train")))
    kubeapi.add(make_pod("llm", "nightly-2911-q", "u3", owner=("Job", "nightly-2911")))
    kubeapi.add(make_pod("llm", "orphan-rs-pod", "u4", owner=("ReplicaSet", "gone")))
    async with Running(kubeapi) as cache:
        await until(lambda: len(names(cache)) == 4 if not isinstance(cache.pods(), Absent)
                    else False)
        assert get(cache, "vllm-7d9f-x").owner == OwnerRef("Deployment", "vllm")
        assert get(cache, "train-0").owner == OwnerRef("StatefulSet", "train")
        assert get(cache, "nightly-2911-q").owner == OwnerRef("CronJob", "nightly")
        assert get(cache, "orphan-rs-pod").owner == OwnerRef("ReplicaSet", "gone")


async def test_bookmark_lets_a_dropped_watch_resume_without_relisting(
        kubeapi: KubeApiPeer) -> None:
    async with Running(kubeapi) as cache:
        await until(lambda: kubeapi.watching > 0)
        for i in range(3):
            kubeapi.add(make_pod("other", f"p{i}", f"u{i}", node="node-b"))  # not ours
        listed_at = cache.resource_version
        assert listed_at != str(kubeapi.rv)  # the watch saw none of those changes...
        kubeapi.bookmark()
        # ...only the bookmark brings the client's version up to the server's.
        await until(lambda: cache.resource_version == str(kubeapi.rv),
                    what=f"the bookmark's version {kubeapi.rv} at the client (was {listed_at})")
        kubeapi.compact()  # without the bookmark the client's version would now be too old
        await kubeapi.drop_watches()
        kubeapi.add(make_pod("llm", "after", "u-after"))
        await until(lambda: names(cache) == {"after"})
        assert kubeapi.lists == 1
        assert cache.relists == 0


async def test_410_gone_relists(kubeapi: KubeApiPeer) -> None:
    kubeapi.add(make_pod("llm", "a", "ua"))
    async with Running(kubeapi) as cache:
        await until(lambda: kubeapi.watching > 0)
        await kubeapi.drop_watches()
        kubeapi.delete("ua")  # happens while disconnected...
        kubeapi.add(make_pod("llm", "b", "ub"))
        kubeapi.compact()  # ...and the history that would replay it is gone
        await until(lambda: names(cache) == {"b"})
        assert cache.relists == 1
        assert kubeapi.lists == 2


async def test_connection_drops_lose_no_event(kubeapi: KubeApiPeer) -> None:
    async with Running(kubeapi) as cache:
        await until(lambda: kubeapi.watching > 0)
        for i in range(5):
            kubeapi.add(make_pod("llm", f"p{i}", f"u{i}"))
            await kubeapi.drop_watches()
        await until(lambda: names(cache) == {f"p{i}" for i in range(5)})
        assert cache.relists == 0


async def test_forbidden_then_fixed(kubeapi: KubeApiPeer) -> None:
    kubeapi.add(make_pod("llm", "a", "ua"))
    kubeapi.allowed = False
    async with Running(kubeapi) as cache:
        await until(lambda: "forbidden (403)" in cache.state()[1])
        assert cache.pods() is Absent.UNAVAILABLE
        kubeapi.allowed = True  # an RBAC fix takes effect
        await until(lambda: cache.state() == (True, "ok"))
        assert names(cache) == {"a"}


async def test_api_unreachable_serves_last_known_then_recovers(kubeapi: KubeApiPeer) -> None:
    kubeapi.add(make_pod("llm", "a", "ua"))
    async with Running(kubeapi) as cache:
        await until(lambda: not isinstance(cache.pods(), Absent))
        await kubeapi.stop()
        await until(lambda: "unreachable" in cache.state()[1])
        assert names(cache) == {"a"}  # the last known pods are kept
        kubeapi.add(make_pod("llm", "b", "ub"))
        await kubeapi.start(kubeapi.port)
        await until(lambda: names(cache) == {"a", "b"})
        assert cache.state() == (True, "ok")


async def test_silent_watch_is_abandoned_after_the_inactivity_timeout(
        kubeapi: KubeApiPeer) -> None:
    async with Running(kubeapi, inactivity_s=0.5) as cache:
        await until(lambda: kubeapi.watching > 0)
        watches = kubeapi.watches
        kubeapi.hang_watches = True  # the server keeps the connection but sends nothing
        kubeapi.add(make_pod("llm", "late", "u-late"))  # the hung watch swallows it

        def reconnected() -> bool:
            # Until the client gives up on the silent watch, the pod cannot have arrived.
            assert names(cache) == set() or kubeapi.watches > watches, \
                "the pod came through the hung watch"
            return kubeapi.watches > watches

        await until(reconnected, within=5, what="a new watch after 0.5 s of silence")
        kubeapi.hang_watches = False
        # The new watch resumes from before the swallowed change and replays it.
        await until(lambda: names(cache) == {"late"}, within=5)
        assert (kubeapi.lists, cache.relists) == (1, 0)


async def test_garbage_in_the_watch_stream_reconnects(kubeapi: KubeApiPeer) -> None:
    async with Running(kubeapi) as cache:
        await until(lambda: kubeapi.watching > 0)
        kubeapi.next_watch_bodies.append(b"{not json\n")
        await kubeapi.drop_watches()
        kubeapi.add(make_pod("llm", "x", "ux"))
        await until(lambda: names(cache) == {"x"})


def test_pod_info_from_json() -> None:
    raw = make_pod("ns", "p", "uid-1", owner=("StatefulSet", "s"),
                   containers=(("a", "1" * 64), ("b", "2" * 64)), labels={"app": "x"})
    raw["metadata"]["annotations"] = {"gpuscale.io/engine": "vllm", "other": "dropped"}
    info = pod_info(raw)
    assert info.uid == "uid-1"
    assert info.owner == OwnerRef("StatefulSet", "s")
    assert info.phase is PodPhase.RUNNING
    assert info.ready
    assert info.container_ids == (("a", "1" * 64), ("b", "2" * 64))
    assert info.labels == (("app", "x"),)
    assert info.annotations == (("gpuscale.io/engine", "vllm"),)
    bare = pod_info({"metadata": {"name": "p"}, "status": {"phase": "Weird"}})
    assert bare.phase is PodPhase.UNKNOWN
    assert bare.owner is None


POD_KEYS = ["metadata", "status", "namespace", "name", "uid", "labels", "annotations",
            "ownerReferences", "controller", "kind", "conditions", "type", "containerStatuses",
            "initContainerStatuses", "containerID", "phase", "podIP"]


@given(json_values(POD_KEYS, max_leaves=40))
def test_any_json_object_reads_as_a_pod(raw: object) -> None:
    """Whatever a pod's fields hold, reading it never raises: a field of the wrong JSON
    type reads as absent."""
    info = pod_info(raw if isinstance(raw, dict) else {"status": raw})
    assert isinstance(info.phase, PodPhase)
    assert all(isinstance(cid, str) for _, cid in info.container_ids)


async def test_a_pod_of_the_wrong_shape_does_not_stop_the_cache(kubeapi: KubeApiPeer) -> None:
    odd = {"metadata": {"uid": "u-odd", "name": "odd", "namespace": "llm", "labels": [1],
                        "ownerReferences": "rs"},
           "spec": {"nodeName": "node-a"}, "status": "Running"}
    async with Running(kubeapi) as cache:
        await until(lambda: kubeapi.watching > 0)
        kubeapi.add(odd)
        kubeapi.add(make_pod("llm", "fine", "u-fine"))
        await until(lambda: names(cache) == {"odd", "fine"})
        assert get(cache, "odd").phase is PodPhase.UNKNOWN
        assert get(cache, "odd").labels == ()
