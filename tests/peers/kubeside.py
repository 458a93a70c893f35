"""The test API server's endpoints beside list and watch (tests/peers/kubeapi.py): API
discovery, single-object reads (Deployment, StatefulSet, ReplicaSet, Job, ConfigMap), the
``/scale`` subresource and SubjectAccessReviews.

- ConfigMaps can be read (``configmaps``), e.g. kube-system/extension-apiserver-authentication.
- SubjectAccessReviews (``authorization.k8s.io/v1``) are answered as the real endpoint
  does (kubernetes/kubernetes ``pkg/registry/authorization/subjectaccessreview/rest.go``):
  201 with the review echoed and ``status.allowed`` / ``denied`` / ``reason`` from
  ``authorize`` (a test's policy); a spec with neither or both of resourceAttributes and
  nonResourceAttributes, or with no user and no group, is a 422 Invalid Status; a body that
  is not a SubjectAccessReview is a 400.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from aiohttp import web

from tests.peers.kubeobjects import status

Policy = Callable[[dict[str, Any]], tuple[bool, bool, str]]  # spec -> allowed, denied, reason


def _deny_all(spec: dict[str, Any]) -> tuple[bool, bool, str]:
    """No opinion, as RBAC answers a request no rule allows: not allowed, not denied."""
    return False, False, ""


def _not_found(message: str = "not found") -> web.Response:
    return web.json_response(status(404, "NotFound", message), status=404)


class SideEndpoints:
    """What the side endpoints serve, and their handlers; the server (KubeApiPeer) supplies
    authentication (``_auth``), its resourceVersion and the collections' state."""

    rv: int

    def __init__(self) -> None:
        self.scales: dict[tuple[str, str, str], str] = {}  # (plural, ns, name) -> selector
        self.discovery: dict[str, list[dict[str, Any]]] = {}  # "group/version" -> resources
        self.owners: dict[tuple[str, str, str], dict[str, Any]] = {}  # (plural, ns, name)
        self.configmaps: dict[tuple[str, str], dict[str, Any]] = {}  # (ns, name) -> object
        self.authorize: Policy = _deny_all
        self.reviews: list[dict[str, Any]] = []  # every SubjectAccessReview spec received

    def _auth(self, request: web.Request) -> web.Response | None:
        raise NotImplementedError  # the server's

    def _state_at(self, path: str, rv: int) -> dict[str, dict[str, Any]]:
        raise NotImplementedError  # the server's

    def set_configmap(self, ns: str, name: str, data: dict[str, str]) -> None:
        self.configmaps[(ns, name)] = {"apiVersion": "v1", "kind": "ConfigMap",
                                       "metadata": {"namespace": ns, "name": name},
                                       "data": dict(data)}

    def add_owner(self, plural: str, ns: str, name: str, owner: tuple[str, str]) -> None:
        self.owners[(plural, ns, name)] = {"metadata": {"namespace": ns, "name": name,
            "ownerReferences": [{"kind": owner[0], "name": owner[1], "controller": True}]}}

    def add_side_routes(self, app: web.Application) -> None:
        app.router.add_get("/apis/{group}/{version}/namespaces/{ns}/{plural}/{name}/scale",
                           self._scale)
        app.router.add_get("/apis/{group}/{version}", self._discover)
        app.router.add_get("/apis/apps/v1/namespaces/{ns}/replicasets/{name}", self._owner)
        app.router.add_get("/apis/batch/v1/namespaces/{ns}/jobs/{name}", self._owner)
        app.router.add_get("/api/v1/namespaces/{ns}/configmaps/{name}", self._configmap)
        for plural in ("deployments", "statefulsets"):
            app.router.add_get(f"/apis/apps/v1/namespaces/{{ns}}/{plural}/{{name}}",
                               self._object)
        app.router.add_post("/apis/authorization.k8s.io/v1/subjectaccessreviews", self._review)

    async def _discover(self, request: web.Request) -> web.Response:
        denied = self._auth(request)
        if denied is not None:
            return denied
        gv = f"{request.match_info['group']}/{request.match_info['version']}"
        if gv not in self.discovery:
            return _not_found()
        return web.json_response({"kind": "APIResourceList", "groupVersion": gv,
                                  "resources": self.discovery[gv]})

    async def _scale(self, request: web.Request) -> web.Response:
        denied = self._auth(request)
        if denied is not None:
            return denied
        m = request.match_info
        selector = self.scales.get((m["plural"], m["ns"], m["name"]))
        if selector is None:
            return _not_found()
        return web.json_response({"kind": "Scale", "apiVersion": "autoscaling/v1",
                                  "metadata": {"namespace": m["ns"], "name": m["name"]},
                                  "spec": {"replicas": 2},
                                  "status": {"replicas": 2, "selector": selector}})

    async def _owner(self, request: web.Request) -> web.Response:
        denied = self._auth(request)
        if denied is not None:
            return denied
        plural = "replicasets" if "/replicasets/" in request.path else "jobs"
        obj = self.owners.get((plural, request.match_info["ns"], request.match_info["name"]))
        if obj is None:
            return _not_found()
        return web.json_response(obj)

    async def _object(self, request: web.Request) -> web.Response:
        """GET one Deployment or StatefulSet, as it is now; 404 as the API server says it
        (``deployments.apps "x" not found``)."""
        denied = self._auth(request)
        if denied is not None:
            return denied
        plural = request.path.split("/")[-2]
        ns, name = request.match_info["ns"], request.match_info["name"]
        for obj in self._state_at(f"/apis/apps/v1/{plural}", self.rv).values():
            meta = obj["metadata"]
            if meta.get("namespace") == ns and meta.get("name") == name:
                return web.json_response(obj)
        return _not_found(f'{plural}.apps "{name}" not found')

    async def _configmap(self, request: web.Request) -> web.Response:
        denied = self._auth(request)
        if denied is not None:
            return denied
        key = (request.match_info["ns"], request.match_info["name"])
        obj = self.configmaps.get(key)
        if obj is None:
            return _not_found(f'configmaps "{key[1]}" not found')
        return web.json_response(obj)

    async def _review(self, request: web.Request) -> web.Response:
        denied = self._auth(request)
        if denied is not None:
            return denied
        try:
            body = json.loads(await request.read())
        except ValueError:
            return web.json_response(status(400, "BadRequest", "the body is not JSON"),
                                     status=400)
        if not isinstance(body, dict) or body.get("kind") != "SubjectAccessReview" or \
                body.get("apiVersion") != "authorization.k8s.io/v1":
            return web.json_response(status(400, "BadRequest", "not a SubjectAccessReview"),
                                     status=400)
        spec = body.get("spec") or {}
        problems = []
        if ("resourceAttributes" in spec) == ("nonResourceAttributes" in spec):
            problems.append("spec.resourceAttributes: Invalid value: \"null\": exactly one "
                            "of nonResourceAttributes or resourceAttributes must be specified")
        if not spec.get("user") and not spec.get("groups"):
            problems.append('spec.user: Invalid value: "": at least one of user or group '
                            "must be specified")
        if problems:
            return web.json_response(status(422, "Invalid", "SubjectAccessReview.authorization"
                                            '.k8s.io "" is invalid: ' + ", ".join(problems)),
                                     status=422)
        self.reviews.append(spec)
        allowed, deny, reason = self.authorize(spec)
        out = dict(body, status={"allowed": allowed, **({"denied": True} if deny else {}),
                                 **({"reason": reason} if reason else {})})
        out.setdefault("metadata", {"creationTimestamp": None})
        return web.json_response(out, status=201)
