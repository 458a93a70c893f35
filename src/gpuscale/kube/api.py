"""The one seam to the Kubernetes API: typed references in, JSON objects out.

Every API path gpuscale requests is built here, from references whose parts are validated
(the API server's own rule for a name in a path: not ``.`` or ``..``, no ``/`` or ``%``)
and escaped, so nothing a caller passes - a ScaledObject's ``scaleTargetRef``, a pod's
owner - can point a request at another path. Callers get one object (``get``), a kind's
resource name from discovery (``resource_of``), or a kept-current collection
(``list_watch``).

The client is lightkube's httpx2 client (kube/connect.py builds it with lightkube's own
config loading, TLS and credentials) and every request is a plain one on it: gpuscale
reads raw JSON, pages its own lists and parses its own watch lines (kube/replies.py), so
lightkube's typed resources would only cost memory and hide the bytes. httpx2 and
lightkube errors do not leave this package: a failed call is an ``ApiError`` (a
``PeerError``) whose message says what to do.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx2

from gpuscale.kube.errors import ApiError, BadReference, BadReply
from gpuscale.kube.listwatch import FAILED, JSON, ListWatch, api_json, describe

log = logging.getLogger(__name__)
CLOSE_TIMEOUT_S = 10.0
GET_TIMEOUT_S = 10  # one request, from sending to the last byte of the answer
# The core group's collections gpuscale watches (access.py grants no other); every other
# group's collections are reached the same way, custom resources included.
CORE_WATCHES = frozenset({"pods"})
MAX_NAME = 253
_VERSION = re.compile(r"v[1-9][0-9]*((alpha|beta)[1-9][0-9]*)?")
_GROUP = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_RESOURCE = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
_KIND = re.compile(r"[A-Za-z][A-Za-z0-9]{0,62}")


def check_name(name: str, what: str = "name") -> str:
    """``name`` if it can stand in an API path (apimachinery's ValidatePathSegmentName, and
    the 253-character bound every object name has); BadReference otherwise."""
    if not name or len(name) > MAX_NAME:
        raise BadReference(f"{what}: must be 1 to {MAX_NAME} characters")
    if name in (".", "..") or "/" in name or "%" in name:
        raise BadReference(f"{what}: {name[:64]!r} cannot be an object name")
    return name


def check_api_version(api_version: str) -> str:
    """``v1`` or ``group/version`` with a DNS-subdomain group; BadReference otherwise."""
    group, _, version = api_version.rpartition("/")
    if not _VERSION.fullmatch(version) or (group and not _GROUP.fullmatch(group)) or \
            len(api_version) > MAX_NAME:
        raise BadReference(f"apiVersion: {api_version[:64]!r} is not v1 or GROUP/VERSION")
    return api_version


def _prefix(api_version: str) -> str:
    return "/api/v1" if api_version == "v1" else f"/apis/{api_version}"


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """One namespaced object: ``resource`` is the plural (``replicasets``), not the kind."""

    api_version: str
    resource: str
    namespace: str
    name: str
    subresource: str = ""  # e.g. "scale"

    def path(self) -> str:
        """The escaped API path; BadReference for a part that cannot be in one."""
        check_api_version(self.api_version)
        if not _RESOURCE.fullmatch(self.resource):
            raise BadReference(f"resource: {self.resource[:64]!r} is not a resource name")
        if self.subresource and not _RESOURCE.fullmatch(self.subresource):
            raise BadReference(f"subresource: {self.subresource[:64]!r}")
        ns = quote(check_name(self.namespace, "namespace"), safe="")
        name = quote(check_name(self.name), safe="")
        tail = f"/{self.subresource}" if self.subresource else ""
        return f"{_prefix(self.api_version)}/namespaces/{ns}/{self.resource}/{name}{tail}"


@dataclass(frozen=True, slots=True)
class Collection:
    """A collection to list and watch: all namespaces (``namespace=""``) or one."""

    api_version: str
    resource: str
    namespace: str = ""
    label_selector: str = ""
    field_selector: str = ""


class KubeApi:
    """Requests on an httpx2 client that has the API server's base URL and the credentials
    (kube/connect.py), behind the seam. ``close`` closes the client."""

    def __init__(self, http: httpx2.AsyncClient) -> None:
        self._http = http
        self._resources: dict[tuple[str, str], str] = {}  # (apiVersion, kind) -> plural

    async def close(self) -> None:
        """Close the client, within ``CLOSE_TIMEOUT_S``: await the watches' tasks first
        (closing the pool while a cancelled stream still unwinds can wait on it); a close
        that does not finish in time is logged and left, never a hang at shutdown."""
        try:
            await asyncio.wait_for(asyncio.shield(self._http.aclose()), CLOSE_TIMEOUT_S)
        except TimeoutError:
            log.warning("the Kubernetes API client did not close within %.0fs",
                        CLOSE_TIMEOUT_S)

    async def get(self, ref: ObjectRef) -> dict[str, Any]:
        """The object as JSON. ApiError (status 404: not found) or BadReference."""
        return await self._get(ref.path())

    async def get_raw(self, path: str) -> dict[str, Any]:
        """GET an API path as ``kubectl get --raw`` does (``/apis/...`` or ``/api/...``,
        with its query), the reply JSON. ApiError (with the server's status) or
        BadReference for a path that is not an API path."""
        if not path.startswith(("/apis/", "/api/")) or len(path) > 8192 or ".." in path:
            raise BadReference(f"path: {path[:80]!r} is not an API path")
        return await self._get(path)

    async def resource_of(self, api_version: str, kind: str) -> str | None:
        """The plural resource name of ``kind`` in ``api_version`` from API discovery
        (cached), or None when the group/version has no such kind."""
        check_api_version(api_version)
        if not _KIND.fullmatch(kind):
            raise BadReference(f"kind: {kind[:64]!r} is not a kind name")
        if (api_version, kind) not in self._resources:
            body = await self._get(_prefix(api_version))
            resources = body.get("resources") or []
            if not isinstance(resources, list):
                raise BadReply(f"discovery of {api_version}: resources is not a list")
            for r in resources:
                if isinstance(r, dict) and r.get("kind") and "/" not in str(r.get("name", "")):
                    self._resources[(api_version, str(r["kind"]))] = str(r["name"])
        return self._resources.get((api_version, kind))

    async def create(self, api_version: str, resource: str,
                     body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` to a cluster-scoped collection (a SubjectAccessReview, which the
        server answers without storing) and return the reply JSON. ApiError on failure."""
        check_api_version(api_version)
        if not _RESOURCE.fullmatch(resource):
            raise BadReference(f"resource: {resource[:64]!r} is not a resource name")
        return await self._call("POST", f"{_prefix(api_version)}/{resource}", body)

    def list_watch(self, collection: Collection, what: str,
                   on_change: Callable[[], Awaitable[None]] | None = None,
                   **options: Any) -> ListWatch:
        """A ListWatch of ``collection`` (not started: run it). ``options`` go to ListWatch
        (monotonic, inactivity_s, backoff_s, max_items, page_size, max_event_bytes)."""
        params = {k: v for k, v in (("labelSelector", collection.label_selector),
                                    ("fieldSelector", collection.field_selector)) if v}
        return ListWatch(self._http, self._collection_path(collection), what, params=params,
                         on_change=on_change, **options)

    @staticmethod
    def _collection_path(c: Collection) -> str:
        check_api_version(c.api_version)
        if not _RESOURCE.fullmatch(c.resource):
            raise BadReference(f"resource: {c.resource[:64]!r} is not a resource name")
        if c.api_version == "v1" and c.resource not in CORE_WATCHES:
            raise BadReference(f"no watch of {c.resource} in {c.api_version}")
        ns = quote(check_name(c.namespace, "namespace"), safe="") if c.namespace else ""
        scope = f"/namespaces/{ns}" if ns else ""
        return f"{_prefix(c.api_version)}{scope}/{c.resource}"

    async def _get(self, path: str) -> dict[str, Any]:
        return await self._call("GET", path)

    async def _call(self, method: str, path: str,
                    body: dict[str, Any] | None = None) -> dict[str, Any]:
        try:
            async with asyncio.timeout(GET_TIMEOUT_S):
                request = self._http.build_request(method, path, headers=JSON, json=body)
                return await api_json(await self._http.send(request, stream=True))
        except ApiError as exc:  # an error answer or one that is not a JSON object
            raise ApiError(f"{method} {path}: {exc}", exc.status) from None
        except FAILED as exc:
            raise ApiError(f"{method} {path}: {describe(exc)}") from None
