"""The one seam to the Kubernetes API: typed references in, JSON objects out.

Every API path gpuscale requests is built here, from references whose parts are validated
(the API server's own rule for a name in a path: not ``.`` or ``..``, no ``/`` or ``%``)
and escaped, so nothing a caller passes - a ScaledObject's ``scaleTargetRef``, a pod's
owner - can point a request at another path. Callers get one object (``get``), a kind's
resource name from discovery (``resource_of``), or a kept-current collection
(``list_watch``). ``ApiException`` and aiohttp errors do not leave this package: a failed
call is an ``ApiError`` (a ``PeerError``) whose message says what to do.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from gpuscale.kube.errors import ApiError, BadReference, BadReply
from gpuscale.kube.listwatch import ListWatch, api_json, describe

GET_TIMEOUT_S = 10
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


ListFn = Callable[..., Awaitable[Any]]


class KubeApi:
    """An API client (kubernetes_asyncio's, with its credentials) behind the seam."""

    def __init__(self, api: client.ApiClient) -> None:
        self._api = api
        self._resources: dict[tuple[str, str], str] = {}  # (apiVersion, kind) -> plural

    async def close(self) -> None:
        await self._api.close()

    async def get(self, ref: ObjectRef) -> dict[str, Any]:
        """The object as JSON. ApiError (status 404: not found) or BadReference."""
        return await self._get(ref.path())

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
        fn, args = self._list_fn(collection)
        kwargs = {k: v for k, v in (("label_selector", collection.label_selector),
                                    ("field_selector", collection.field_selector)) if v}
        return ListWatch(fn, what, list_args=args, list_kwargs=kwargs, on_change=on_change,
                         **options)

    def _list_fn(self, c: Collection) -> tuple[ListFn, tuple[Any, ...]]:
        check_api_version(c.api_version)
        ns = (check_name(c.namespace, "namespace"),) if c.namespace else ()
        core, apps = client.CoreV1Api(self._api), client.AppsV1Api(self._api)
        table: dict[tuple[str, str, bool], tuple[ListFn, tuple[Any, ...]]] = {
            ("v1", "pods", False): (core.list_pod_for_all_namespaces, ()),
            ("apps/v1", "deployments", False): (apps.list_deployment_for_all_namespaces, ()),
            ("apps/v1", "statefulsets", False): (apps.list_stateful_set_for_all_namespaces,
                                                 ()),
            ("discovery.k8s.io/v1", "endpointslices", True): (
                client.DiscoveryV1Api(self._api).list_namespaced_endpoint_slice, ns),
        }
        known = table.get((c.api_version, c.resource, bool(ns)))
        if known is not None:
            return known
        group, _, version = c.api_version.rpartition("/")
        if not group:
            raise BadReference(f"no watch of {c.resource} in {c.api_version}")
        custom = client.CustomObjectsApi(self._api)
        if ns:
            return custom.list_namespaced_custom_object, (group, version, *ns, c.resource)
        return custom.list_cluster_custom_object, (group, version, c.resource)

    async def _get(self, path: str) -> dict[str, Any]:
        return await self._call("GET", path)

    async def _call(self, method: str, path: str,
                    body: dict[str, Any] | None = None) -> dict[str, Any]:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        try:
            resp = await self._api.call_api(
                path, method, header_params=headers, body=body,
                auth_settings=["BearerToken"], _preload_content=False,
                _request_timeout=GET_TIMEOUT_S)
            return await api_json(resp)
        except ApiError as exc:  # an error answer or one that is not a JSON object
            raise ApiError(f"{method} {path}: {exc}", exc.status) from None
        except ApiException as exc:
            raise ApiError(f"{method} {path}: {describe(exc)}", exc.status or 0) from None
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            raise ApiError(f"{method} {path}: {describe(exc)}") from None
