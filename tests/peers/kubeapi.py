"""A test Kubernetes API server: list/watch of pods, Deployments, StatefulSets, KEDA
ScaledObjects and EndpointSlices in the real wire format, object reads (ReplicaSet, Job)
and /scale.

What it reproduces of the real kube-apiserver, and where that behaviour lives there
(kubernetes/kubernetes, staging/src/k8s.io/apiserver/pkg/storage/):

- Selectors: label selectors of every form and the field selectors each resource supports
  (tests/peers/kubeselect.py); a selector the server would refuse is a 400 Status.
- A watch sees an object through its selectors before *and* after each change
  (``cacher/cache_watcher.go`` ``convertToWatchEvent``): one that starts matching arrives as
  ADDED, one that stops matching as DELETED (carrying its previous content with the new
  resourceVersion), one that matches neither time not at all.
- Bookmarks: a watch that asked ``allowWatchBookmarks=true`` gets a BOOKMARK with the current
  resourceVersion every ``bookmark_every`` seconds (``cache_watcher.go`` ``nextBookmarkTime``:
  "roughly every minute") - also when none of the changes matched its selectors.
- A watch from a resourceVersion older than the compaction gets an ERROR event carrying a
  410 Expired Status; a watch from "" or "0" starts with synthetic ADDED events.
- Paginated lists (``etcd3/store.go`` ``GetList``, tests/peers/kubepaging.py), every page
  read at the first page's resourceVersion. A continue token older than the compaction is
  answered 410 Expired with the apiserver's message and an "inconsistent" token
  (resourceVersion -1) in the Status (``etcd3/errors.go``
  ``handleCompactedErrorForPaging``); a token it cannot decode is a 400.
- Auth failures are Status objects: 401 for a bearer token it cannot authenticate (a
  wrong or rotated one), 403 for the right token while ``allowed`` is False (RBAC).
- Objects carry ``metadata.creationTimestamp``, set when stored without one and kept
  across changes (immutable, as the API server keeps it); pods from ``make_pod``
  (tests/peers/kubeobjects.py, with the other object builders) carry what the kubelet
  writes: the Ready condition's ``lastTransitionTime`` and each container's
  ``restartCount``.
- Discovery, single-object reads, ConfigMaps, ``/scale`` and SubjectAccessReviews:
  tests/peers/kubeside.py.

And hostile answers a real server might never send but a proxy or a bug could: a test queues
raw list bodies (``next_list_replies``), raw watch streams (``next_watch_bodies``) or pushes
raw bytes into the open watches (``send_raw``), and can act between list pages
(``on_list_page``, e.g. to compact while a client pages).
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from aiohttp import web

if TYPE_CHECKING:
    from gpuscale.kube.api import KubeApi

from tests.peers.kubeobjects import (
    make_endpointslice,
    make_pod,
    make_scaledobject,
    make_workload,
    status,
)
from tests.peers.kubepaging import CONTINUE_EXPIRED, decode_continue, encode_continue, list_page
from tests.peers.kubeselect import (
    GENERIC_FIELDS,
    POD_FIELDS,
    SLICE_FIELDS,
    Selection,
    SelectorError,
    selection,
)
from tests.peers.kubeside import SideEndpoints

# The object builders and continue tokens are importable from here, as before their split.
__all__ = ["DEPLOYMENTS", "ENDPOINTSLICES", "PODS", "RESOURCESLICES", "SCALEDOBJECTS",
           "STATEFULSETS", "Change", "KubeApiPeer", "api_client", "decode_continue",
           "encode_continue", "make_endpointslice", "make_pod", "make_scaledobject",
           "make_workload", "status"]


def _now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


PODS = "/api/v1/pods"
DEPLOYMENTS = "/apis/apps/v1/deployments"
STATEFULSETS = "/apis/apps/v1/statefulsets"
SCALEDOBJECTS = "/apis/keda.sh/v1alpha1/scaledobjects"
ENDPOINTSLICES = "/apis/discovery.k8s.io/v1/namespaces/gpuscale/endpointslices"
RESOURCESLICES = "/apis/resource.k8s.io/v1/resourceslices"
COLLECTIONS = (PODS, DEPLOYMENTS, STATEFULSETS, SCALEDOBJECTS, ENDPOINTSLICES, RESOURCESLICES)
KINDS = {PODS: ("v1", "Pod"), DEPLOYMENTS: ("apps/v1", "Deployment"),
         STATEFULSETS: ("apps/v1", "StatefulSet"),
         SCALEDOBJECTS: ("keda.sh/v1alpha1", "ScaledObject"),
         ENDPOINTSLICES: ("discovery.k8s.io/v1", "EndpointSlice"),
         RESOURCESLICES: ("resource.k8s.io/v1", "ResourceSlice")}
FIELDS = {PODS: POD_FIELDS, RESOURCESLICES: SLICE_FIELDS}

@dataclass
class Change:
    """One write: the object after it (for DELETED: its last content) and before it."""

    rv: int
    path: str
    kind: str  # ADDED, MODIFIED, DELETED
    obj: dict[str, Any]
    prev: dict[str, Any] | None


@dataclass
class _Watcher:
    path: str
    bookmarks: bool
    queue: asyncio.Queue[Change | bytes | str | None] = field(default_factory=asyncio.Queue)
    done: asyncio.Event = field(default_factory=asyncio.Event)


class KubeApiPeer(SideEndpoints):
    def __init__(self, token: str = "t0ken") -> None:
        super().__init__()
        self.token = token
        self.allowed = True  # False: the token authenticates, RBAC refuses every call
        self.forbidden: set[str] = set()  # path prefixes RBAC refuses (a missing binding)
        self.rv = 100
        self.compacted = 0
        self.objects: dict[str, dict[str, dict[str, Any]]] = {c: {} for c in COLLECTIONS}
        self.pods = self.objects[PODS]
        self.history: list[Change] = []
        self.bookmark_every: float | None = 60.0  # seconds; None: no periodic bookmarks
        self.hang_watches = False
        self.next_list_replies: list[tuple[int, bytes]] = []  # (HTTP status, raw body)
        self.next_watch_bodies: list[bytes] = []  # one raw stream per watch request
        self.on_list_page: Callable[[web.Request], None] | None = None  # before each page
        self.lists = 0  # lists started (first pages)
        self.list_pages = 0  # every list request, continued pages included
        self.watches = 0
        self.bookmarks_sent = 0
        self._watchers: list[_Watcher] = []
        self._runner: web.AppRunner | None = None
        self.port = 0

    # -- control -------------------------------------------------------------------------

    @property
    def watching(self) -> int:
        """Open watch connections."""
        return len(self._watchers)

    def _write(self, path: str, kind: str, obj: dict[str, Any] | None, uid: str) -> None:
        self.rv += 1
        store = self.objects[path]
        prev = store.get(uid)
        if obj is None:  # a delete: the event carries the last content
            assert prev is not None, f"no object {uid} in {path}"
            obj = store.pop(uid)
        else:
            obj = copy.deepcopy(obj)
            meta = obj["metadata"]
            meta["resourceVersion"] = str(self.rv)
            # Set at creation (now, where the stored object has none), immutable after.
            meta["creationTimestamp"] = (prev["metadata"].get("creationTimestamp")
                                         if prev is not None else
                                         meta.get("creationTimestamp") or _now_rfc3339())
            store[uid] = obj
        change = Change(self.rv, path, kind, copy.deepcopy(obj), copy.deepcopy(prev))
        self.history.append(change)
        for w in self._watchers:
            if w.path == path:
                w.queue.put_nowait(change)

    def add(self, obj: dict[str, Any], path: str = PODS) -> None:
        self._write(path, "ADDED", obj, obj["metadata"]["uid"])

    def modify(self, obj: dict[str, Any], path: str = PODS) -> None:
        self._write(path, "MODIFIED", obj, obj["metadata"]["uid"])

    def delete(self, uid: str, path: str = PODS) -> None:
        self._write(path, "DELETED", None, uid)

    def bookmark(self) -> None:
        """A bookmark now, on every open watch that asked for them."""
        for w in self._watchers:
            w.queue.put_nowait("bookmark")

    def send_raw(self, data: bytes) -> None:
        """Write ``data`` as it is (no newline added) into every open watch stream."""
        for w in self._watchers:
            w.queue.put_nowait(data)

    def compact(self) -> None:
        """Forget history: watches from an older resourceVersion, and continue tokens of
        lists read at one, now get 410."""
        self.compacted = self.rv

    async def drop_watches(self) -> None:
        """Cut every open watch connection (a load balancer or API server restart) and
        return once their handlers are gone."""
        watchers = list(self._watchers)
        for w in watchers:
            w.queue.put_nowait(None)
        await asyncio.wait_for(asyncio.gather(*(w.done.wait() for w in watchers)), 10)

    # -- server --------------------------------------------------------------------------

    async def start(self, port: int = 0) -> None:
        app = web.Application()
        for path in COLLECTIONS:
            app.router.add_get(path, self._collection)
        self.add_side_routes(app)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port or self.port)
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        await self.drop_watches()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def _auth(self, request: web.Request) -> web.Response | None:
        got = request.headers.get("Authorization", "")
        if not got:
            return web.json_response(status(401, "Unauthorized", "Unauthorized"), status=401)
        if got != f"Bearer {self.token}":  # a token it cannot authenticate: 401, as kube's
            return web.json_response(status(401, "Unauthorized", "Unauthorized"), status=401)
        if not self.allowed or any(request.path.startswith(p) for p in self.forbidden):
            # authenticated, but RBAC does not allow it (everything, or these paths)
            return web.json_response(status(403, "Forbidden", 'pods is forbidden: User '
                                            '"system:serviceaccount:x:y" cannot list'),
                                     status=403)
        return None

    async def _collection(self, request: web.Request) -> web.StreamResponse:
        denied = self._auth(request)
        if denied is not None:
            return denied
        try:
            sel = selection(request.query.get("labelSelector", ""),
                            request.query.get("fieldSelector", ""),
                            FIELDS.get(request.path, GENERIC_FIELDS))
        except SelectorError as exc:
            return web.json_response(status(400, "BadRequest", str(exc)), status=400)
        if request.query.get("watch") in ("true", "1", "True"):
            return await self._watch(request, sel)
        return self._list(request, sel)

    def _state_at(self, path: str, rv: int) -> dict[str, dict[str, Any]]:
        """The collection as it was at ``rv``, replayed from the history."""
        state: dict[str, dict[str, Any]] = {}
        for ch in self.history:
            if ch.rv > rv:
                break
            if ch.path == path:
                uid = ch.obj["metadata"]["uid"]
                if ch.kind == "DELETED":
                    state.pop(uid, None)
                else:
                    state[uid] = ch.obj
        return state

    def _list(self, request: web.Request, sel: Selection) -> web.Response:
        self.list_pages += 1
        if self.on_list_page is not None:
            self.on_list_page(request)
        if self.next_list_replies:
            code, body = self.next_list_replies.pop(0)
            return web.Response(status=code, body=body, content_type="application/json")
        try:
            limit = int(request.query.get("limit") or 0)
        except ValueError:
            return web.json_response(status(400, "BadRequest", "invalid limit"), status=400)
        token = request.query.get("continue", "")
        if token:
            try:
                rv, start = decode_continue(token)
            except (ValueError, TypeError, AttributeError):
                return web.json_response(status(400, "BadRequest", "invalid continue token"),
                                         status=400)
            if 0 < rv < self.compacted:
                return web.json_response(status(
                    410, "Expired", CONTINUE_EXPIRED,
                    {"continue": encode_continue(-1, start)}), status=410)
            snapshot = self.rv if rv < 0 else rv
        else:
            self.lists += 1
            snapshot, start = self.rv, ""
        page, meta = list_page(self._state_at(request.path, snapshot).values(), sel, limit,
                               start, snapshot)
        api_version, kind = KINDS[request.path]
        return web.json_response({"kind": f"{kind}List", "apiVersion": api_version,
                                  "metadata": meta, "items": page})

    @staticmethod
    def _convert(ch: Change, sel: Selection) -> dict[str, Any] | None:
        """What one watcher sees of a change (cache_watcher.go convertToWatchEvent)."""
        now = ch.kind != "DELETED" and sel.matches(ch.obj)
        before = ch.prev is not None and sel.matches(ch.prev)
        if now:
            return {"type": "MODIFIED" if before else "ADDED", "object": ch.obj}
        if before:
            assert ch.prev is not None
            gone = copy.deepcopy(ch.prev)
            gone["metadata"]["resourceVersion"] = str(ch.rv)
            return {"type": "DELETED", "object": gone}
        return None

    def _bookmark_event(self, path: str) -> dict[str, Any]:
        self.bookmarks_sent += 1
        api_version, kind = KINDS[path]
        return {"type": "BOOKMARK", "object": {
            "kind": kind, "apiVersion": api_version,
            "metadata": {"resourceVersion": str(self.rv), "creationTimestamp": None}}}

    async def _watch(self, request: web.Request, sel: Selection) -> web.StreamResponse:
        self.watches += 1
        try:
            since = int(request.query.get("resourceVersion") or 0)
        except ValueError:
            return web.json_response(status(400, "BadRequest", "invalid resourceVersion"),
                                     status=400)
        timeout = float(request.query.get("timeoutSeconds") or 3600)
        bookmarks = request.query.get("allowWatchBookmarks") in ("true", "1", "True")
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        if self.next_watch_bodies:
            await resp.write(self.next_watch_bodies.pop(0))
            return resp
        if 0 < since < self.compacted:
            await self._send(resp, {"type": "ERROR", "object": status(
                410, "Expired", f"too old resource version: {since} ({self.compacted})")})
            return resp
        w = _Watcher(request.path, bookmarks)
        self._watchers.append(w)
        loop = asyncio.get_running_loop()
        try:
            if since == 0:  # "" or "0": the current objects as ADDED, then changes
                for obj in self.objects[request.path].values():
                    if sel.matches(obj):
                        await self._send(resp, {"type": "ADDED", "object": obj})
            else:
                for ch in self.history:
                    if ch.path == request.path and ch.rv > since:
                        event = self._convert(ch, sel)
                        if event is not None:
                            await self._send(resp, event)
            deadline = loop.time() + timeout
            next_bookmark = loop.time() + (self.bookmark_every or 0)
            while (left := deadline - loop.time()) > 0:
                if bookmarks and self.bookmark_every:
                    left = min(left, max(0.0, next_bookmark - loop.time()))
                try:
                    item = await asyncio.wait_for(w.queue.get(), left)
                except TimeoutError:
                    if bookmarks and self.bookmark_every and loop.time() >= next_bookmark:
                        next_bookmark = loop.time() + self.bookmark_every
                        item = "bookmark"
                    else:
                        continue
                if item is None:  # dropped: end without a clean close
                    if request.transport is not None:
                        request.transport.close()
                    return resp
                if self.hang_watches:
                    continue
                if isinstance(item, bytes):
                    await resp.write(item)
                elif isinstance(item, str):
                    if bookmarks:
                        await self._send(resp, self._bookmark_event(request.path))
                else:
                    event = self._convert(item, sel)
                    if event is not None:
                        await self._send(resp, event)
        finally:
            self._watchers.remove(w)
            w.done.set()
        return resp

    @staticmethod
    async def _send(resp: web.StreamResponse, event: dict[str, Any]) -> None:
        await resp.write(json.dumps(event).encode() + b"\n")

def api_client(peer: KubeApiPeer, token: str | None = None) -> KubeApi:
    """gpuscale's API seam for the peer, built as in a cluster (kube/credentials.py, on
    lightkube's config) with its bearer token (or another)."""
    from lightkube.config.kubeconfig import KubeConfig
    from lightkube.config.models import Cluster, User

    from gpuscale.kube.credentials import api_for

    config = KubeConfig.from_one(cluster=Cluster(server=f"http://127.0.0.1:{peer.port}"),
                                 user=User(token=token if token is not None else peer.token))
    single = config.get()
    assert single is not None
    return api_for(single)
