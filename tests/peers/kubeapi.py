"""A test Kubernetes API server: list/watch of pods, Deployments, StatefulSets and KEDA
ScaledObjects in the real wire format, object reads (ReplicaSet, Job) and /scale.

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


PODS = "/api/v1/pods"
DEPLOYMENTS = "/apis/apps/v1/deployments"
STATEFULSETS = "/apis/apps/v1/statefulsets"
SCALEDOBJECTS = "/apis/keda.sh/v1alpha1/scaledobjects"
ENDPOINTSLICES = "/apis/discovery.k8s.io/v1/namespaces/gpuscale/endpointslices"
COLLECTIONS = (PODS, DEPLOYMENTS, STATEFULSETS, SCALEDOBJECTS, ENDPOINTSLICES)


class KubeApiPeer:
    def __init__(self, token: str = "t0ken") -> None:
        self.token = token
        self.rv = 100
        self.compacted = 0
        self.objects: dict[str, dict[str, dict[str, Any]]] = {c: {} for c in COLLECTIONS}
        self.pods = self.objects[PODS]
        self.scales: dict[tuple[str, str, str], str] = {}  # (plural, ns, name) -> selector
        self.discovery: dict[str, list[dict[str, Any]]] = {}  # "group/version" -> resources
        self.history: list[tuple[int, str, str, dict[str, Any]]] = []  # rv, path, type, obj
        self.owners: dict[tuple[str, str, str], dict[str, Any]] = {}  # (plural, ns, name)
        self.hang_watches = False
        self.garbage_next_watch = False
        self.lists = 0
        self.watches = 0
        self._streams: set[web.StreamResponse] = set()
        self._queues: dict[asyncio.Queue[dict[str, Any] | None], str] = {}
        self._runner: web.AppRunner | None = None
        self.port = 0

    # -- control -------------------------------------------------------------------------

    @property
    def watching(self) -> int:
        """Open watch connections."""
        return len(self._queues)

    def _event(self, path: str, kind: str, obj: dict[str, Any]) -> None:
        self.rv += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.history.append((self.rv, path, kind, obj))
        for q, qpath in self._queues.items():
            if qpath == path:
                q.put_nowait({"type": kind, "object": obj})

    def add(self, obj: dict[str, Any], path: str = PODS) -> None:
        self.objects[path][obj["metadata"]["uid"]] = obj
        self._event(path, "ADDED", obj)

    def modify(self, obj: dict[str, Any], path: str = PODS) -> None:
        self.objects[path][obj["metadata"]["uid"]] = obj
        self._event(path, "MODIFIED", obj)

    def delete(self, uid: str, path: str = PODS) -> None:
        self._event(path, "DELETED", self.objects[path].pop(uid))

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
        for path in COLLECTIONS:
            app.router.add_get(path, self._collection)
        app.router.add_get("/apis/{group}/{version}/namespaces/{ns}/{plural}/{name}/scale",
                           self._scale)
        app.router.add_get("/apis/{group}/{version}", self._discover)
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
        labels = request.query.get("labelSelector", "")
        if labels:
            key, _, value = labels.partition("=")
            if (pod.get("metadata", {}).get("labels") or {}).get(key) != value:
                return False
        sel = request.query.get("fieldSelector", "")
        if not sel:
            return True
        key, _, value = sel.partition("=")
        assert key == "spec.nodeName", f"unexpected field selector {sel}"
        return bool(pod.get("spec", {}).get("nodeName") == value)

    async def _collection(self, request: web.Request) -> web.StreamResponse:
        denied = self._auth(request)
        if denied is not None:
            return denied
        if request.query.get("watch") in ("true", "1", "True"):
            return await self._watch(request)
        self.lists += 1
        items = [p for p in self.objects[request.path].values() if self._selected(request, p)]
        return web.json_response({"kind": "List", "apiVersion": "v1",
                                  "metadata": {"resourceVersion": str(self.rv)},
                                  "items": items})

    async def _discover(self, request: web.Request) -> web.Response:
        gv = f"{request.match_info['group']}/{request.match_info['version']}"
        if gv not in self.discovery:
            return web.json_response(status(404, "NotFound", "not found"), status=404)
        return web.json_response({"kind": "APIResourceList", "groupVersion": gv,
                                  "resources": self.discovery[gv]})

    async def _scale(self, request: web.Request) -> web.Response:
        denied = self._auth(request)
        if denied is not None:
            return denied
        m = request.match_info
        selector = self.scales.get((m["plural"], m["ns"], m["name"]))
        if selector is None:
            return web.json_response(status(404, "NotFound", "not found"), status=404)
        return web.json_response({"kind": "Scale", "apiVersion": "autoscaling/v1",
                                  "metadata": {"namespace": m["ns"], "name": m["name"]},
                                  "spec": {"replicas": 2},
                                  "status": {"replicas": 2, "selector": selector}})

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
        self._queues[queue] = request.path
        try:
            for rv, path, kind, obj in self.history:
                if path == request.path and rv > since and self._selected(request, obj):
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
            self._queues.pop(queue, None)
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


def make_workload(kind: str, ns: str, name: str, match_labels: dict[str, str],
                  expressions: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    selector: dict[str, Any] = {"matchLabels": match_labels}
    if expressions:
        selector["matchExpressions"] = expressions
    return {"apiVersion": "apps/v1", "kind": kind,
            "metadata": {"namespace": ns, "name": name, "uid": f"uid-{kind}-{ns}-{name}"},
            "spec": {"selector": selector, "replicas": 2}}


def make_scaledobject(ns: str, name: str, target: str, kind: str = "Deployment",
                      api_version: str = "apps/v1") -> dict[str, Any]:
    return {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
            "metadata": {"namespace": ns, "name": name, "uid": f"uid-so-{ns}-{name}"},
            "spec": {"scaleTargetRef": {"name": target, "kind": kind,
                                        "apiVersion": api_version},
                     "triggers": [{"type": "external", "metadata": {}}]}}


def make_endpointslice(service: str, name: str, endpoints: list[tuple[str, bool]],
                       port: int | None = None,
                       nodes: list[str] | None = None) -> dict[str, Any]:
    """An EndpointSlice of ``service`` with (ip, ready) endpoints; ``nodes``: each
    endpoint's nodeName (the EndpointSlice controller sets it from the pod)."""
    eps: list[dict[str, Any]] = [{"addresses": [ip], "conditions": {"ready": ready}}
                                 for ip, ready in endpoints]
    for ep, node in zip(eps, nodes or [], strict=False):
        ep["nodeName"] = node
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "addressType": "IPv4",
            "metadata": {"namespace": "gpuscale", "name": name, "uid": f"uid-eps-{name}",
                         "labels": {"kubernetes.io/service-name": service}},
            "ports": [{"name": "telemetry", "port": port, "protocol": "TCP"}] if port else [],
            "endpoints": eps}


def api_client(peer: KubeApiPeer, token: str | None = None) -> Any:
    """gpuscale's API seam over a kubernetes_asyncio ApiClient for the peer, with its
    bearer token (or another)."""
    from kubernetes_asyncio import client

    from gpuscale.kube.api import KubeApi

    conf = client.Configuration(host=f"http://127.0.0.1:{peer.port}")
    conf.api_key = {"BearerToken": token if token is not None else peer.token}
    conf.api_key_prefix = {"BearerToken": "Bearer"}
    return KubeApi(client.ApiClient(conf))
