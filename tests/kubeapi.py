"""A test Kubernetes API server: pods list/watch in the real wire format, and the
ReplicaSet/Job reads the owner chain needs.

Wire format as the API server speaks it: lists carry ``metadata.resourceVersion``; a watch
(``?watch=true&resourceVersion=N&allowWatchBookmarks=true&timeoutSeconds=S``) is a chunked
HTTP response of one JSON event per line (ADDED, MODIFIED, DELETED, BOOKMARK); a
resourceVersion older than the server's compaction gets an ERROR event carrying a Status
with code 410 (Expired); auth failures are Status objects with 401/403.
"""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

from aiohttp import web


def make_pod(ns: str, name: str, uid: str, node: str = "node-a", *,
             owner: tuple[str, str] | None = None, ready: bool = True, ip: str = "10.0.0.1",
             containers: tuple[tuple[str, str], ...] = (("main", "c" * 64),),
             labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": ns, "name": name, "uid": uid,
                            "labels": labels or {"app": name}}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner[0],
                                    "name": owner[1], "uid": "o-" + owner[1],
                                    "controller": True}]
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"nodeName": node},
        "status": {"phase": "Running", "podIP": ip,
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                   "containerStatuses": [{"name": c, "containerID": f"containerd://{cid}"}
                                         for c, cid in containers]}}


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


class KubeApiPeer:
    def __init__(self, token: str = "t0ken") -> None:
        self.token = token
        self.rv = 100
        self.compacted = 0
        self.pods: dict[str, dict[str, Any]] = {}
        self.history: list[tuple[int, str, dict[str, Any]]] = []
        self.owners: dict[tuple[str, str, str], dict[str, Any]] = {}  # (plural, ns, name)
        self.hang_watches = False
        self.garbage_next_watch = False
        self.lists = 0
        self.watches = 0
        self._streams: set[web.StreamResponse] = set()
        self._queues: set[asyncio.Queue[dict[str, Any] | None]] = set()
        self._runner: web.AppRunner | None = None
        self.port = 0

    # -- control -------------------------------------------------------------------------

    @property
    def watching(self) -> int:
        """Open watch connections."""
        return len(self._queues)

    def _event(self, kind: str, obj: dict[str, Any]) -> None:
        self.rv += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.history.append((self.rv, kind, obj))
        for q in self._queues:
            q.put_nowait({"type": kind, "object": obj})

    def add(self, pod: dict[str, Any]) -> None:
        self.pods[pod["metadata"]["uid"]] = pod
        self._event("ADDED", pod)

    def modify(self, pod: dict[str, Any]) -> None:
        self.pods[pod["metadata"]["uid"]] = pod
        self._event("MODIFIED", pod)

    def delete(self, uid: str) -> None:
        self._event("DELETED", self.pods.pop(uid))

    def bookmark(self) -> None:
        for q in self._queues:
            q.put_nowait({"type": "BOOKMARK", "object": {
                "kind": "Pod", "apiVersion": "v1",
                "metadata": {"resourceVersion": str(self.rv)}}})

    def compact(self) -> None:
        """Forget history: watches from an older resourceVersion now get 410."""
        self.compacted = self.rv

    async def drop_watches(self) -> None:
        """Cut every open watch connection (a load balancer or API server restart)."""
        for q in list(self._queues):
            q.put_nowait(None)
        await asyncio.sleep(0.05)

    # -- server --------------------------------------------------------------------------

    async def start(self, port: int = 0) -> None:
        app = web.Application()
        app.router.add_get("/api/v1/pods", self._pods)
        app.router.add_get("/apis/apps/v1/namespaces/{ns}/replicasets/{name}", self._owner)
        app.router.add_get("/apis/batch/v1/namespaces/{ns}/jobs/{name}", self._owner)
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
        if got != f"Bearer {self.token}":
            return web.json_response(status(403, "Forbidden", 'pods is forbidden: User '
                                            '"system:serviceaccount:x:y" cannot list'),
                                     status=403)
        return None

    def _selected(self, request: web.Request, pod: dict[str, Any]) -> bool:
        sel = request.query.get("fieldSelector", "")
        if not sel:
            return True
        key, _, value = sel.partition("=")
        assert key == "spec.nodeName", f"unexpected field selector {sel}"
        return bool(pod["spec"]["nodeName"] == value)

    async def _pods(self, request: web.Request) -> web.StreamResponse:
        denied = self._auth(request)
        if denied is not None:
            return denied
        if request.query.get("watch") in ("true", "1", "True"):
            return await self._watch(request)
        self.lists += 1
        items = [p for p in self.pods.values() if self._selected(request, p)]
        return web.json_response({"kind": "PodList", "apiVersion": "v1",
                                  "metadata": {"resourceVersion": str(self.rv)},
                                  "items": items})

    async def _watch(self, request: web.Request) -> web.StreamResponse:
        self.watches += 1
        since = int(request.query.get("resourceVersion") or 0)
        timeout = float(request.query.get("timeoutSeconds") or 3600)
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        if self.garbage_next_watch:
            self.garbage_next_watch = False
            await resp.write(b"{not json\n")
            return resp
        if since < self.compacted:
            await self._send(resp, {"type": "ERROR", "object": status(
                410, "Expired", f"too old resource version: {since} ({self.compacted})")})
            return resp
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self._queues.add(queue)
        try:
            for rv, kind, obj in self.history:
                if rv > since and self._selected(request, obj):
                    await self._send(resp, {"type": kind, "object": obj})
            deadline = asyncio.get_running_loop().time() + timeout
            while True:
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    break
                try:
                    event = await asyncio.wait_for(queue.get(), left)
                except TimeoutError:
                    break
                if event is None:  # dropped: end without a clean close
                    if request.transport is not None:
                        request.transport.close()
                    return resp
                if self.hang_watches:
                    continue
                if event["type"] == "BOOKMARK" or self._selected(request, event["object"]):
                    await self._send(resp, event)
        finally:
            self._queues.discard(queue)
        return resp

    @staticmethod
    async def _send(resp: web.StreamResponse, event: dict[str, Any]) -> None:
        await resp.write(json.dumps(event).encode() + b"\n")

    async def _owner(self, request: web.Request) -> web.Response:
        denied = self._auth(request)
        if denied is not None:
            return denied
        plural = "replicasets" if "/replicasets/" in request.path else "jobs"
        obj = self.owners.get((plural, request.match_info["ns"], request.match_info["name"]))
        if obj is None:
            return web.json_response(status(404, "NotFound", "not found"), status=404)
        return web.json_response(obj)

    def add_owner(self, plural: str, ns: str, name: str, owner: tuple[str, str]) -> None:
        self.owners[(plural, ns, name)] = {"metadata": {"namespace": ns, "name": name,
            "ownerReferences": [{"kind": owner[0], "name": owner[1], "controller": True}]}}
