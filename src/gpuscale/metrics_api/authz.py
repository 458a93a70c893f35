"""May this user do this? Delegated to the cluster with a SubjectAccessReview, cached.

As k8s.io/apiserver's delegating authorizer: every request that is not to an always-allowed
path (/healthz, /livez, /readyz) or from ``system:masters`` is reviewed; decisions are
kept ``ALLOW_TTL_S`` / ``DENY_TTL_S`` seconds (its defaults, 10 s each), in a bounded
cache, and concurrent identical questions share one review (a thousand HPAs asking at
once cost the API server one request per distinct question, not a thousand). A review
that fails is neither an allow nor a cached deny: the request is refused with the reason
(500), and the next one asks again.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gpuscale.common.errors import PeerError
from gpuscale.metrics_api.authn import User

ALLOW_TTL_S = 10.0
DENY_TTL_S = 10.0
MAX_CACHED = 10_000
MAX_CACHED_BYTES = 16 * 1024 * 1024  # of the questions kept as keys (users' groups, extras)
ALWAYS_ALLOWED_PATHS = frozenset({"/healthz", "/livez", "/readyz"})
PRIVILEGED_GROUP = "system:masters"


class ReviewApi(Protocol):
    async def create(self, api_version: str, resource: str,
                     body: dict[str, Any]) -> dict[str, Any]:
        ...


@dataclass(frozen=True, slots=True)
class Attributes:
    """What is asked: a resource (group, version, resource, namespace, name,
    subresource) or, with ``path`` set, a non-resource URL; always with a verb."""

    verb: str
    path: str = ""
    group: str = ""
    version: str = ""
    resource: str = ""
    namespace: str = ""
    name: str = ""
    subresource: str = ""

    def spec(self) -> dict[str, Any]:
        if self.path:
            return {"nonResourceAttributes": {"path": self.path, "verb": self.verb}}
        attrs = {"verb": self.verb, "group": self.group, "version": self.version,
                 "resource": self.resource, "namespace": self.namespace, "name": self.name,
                 "subresource": self.subresource}
        return {"resourceAttributes": {k: v for k, v in attrs.items() if v}}

    def describe(self) -> str:
        if self.path:
            return f"{self.verb} {self.path}"
        what = self.resource + (f"/{self.subresource}" if self.subresource else "")
        where = f" in namespace {self.namespace}" if self.namespace else ""
        return f"{self.verb} {what} {self.name!r} in group {self.group}{where}"


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    reason: str


def review_body(user: User, attrs: Attributes) -> dict[str, Any]:
    spec: dict[str, Any] = {"user": user.name, **attrs.spec()}
    if user.groups:
        spec["groups"] = list(user.groups)
    if user.extra:
        spec["extra"] = {k: list(v) for k, v in user.extra.items()}
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": spec}


def decision_of(reply: Mapping[str, Any]) -> Decision:
    """The decision in a SubjectAccessReview reply. PeerError for one that has none."""
    status = reply.get("status")
    if not isinstance(status, dict) or not isinstance(status.get("allowed", False), bool):
        raise PeerError("the SubjectAccessReview reply has no status.allowed")
    if status.get("evaluationError") and not status.get("allowed"):
        reason = f"{status.get('reason') or 'not allowed'} ({status['evaluationError']})"
    else:
        reason = str(status.get("reason") or "")
    return Decision(bool(status.get("allowed")) and not status.get("denied"), reason[:500])


class Authorizer:
    def __init__(self, api: ReviewApi, allow_ttl_s: float = ALLOW_TTL_S,
                 deny_ttl_s: float = DENY_TTL_S, max_cached: int = MAX_CACHED,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._api = api
        self._ttl = {True: allow_ttl_s, False: deny_ttl_s}
        self._max = max_cached
        self._monotonic = monotonic
        self._cache: OrderedDict[tuple[Any, ...], tuple[float, Decision, int]] = OrderedDict()
        self._bytes = 0
        self.max_bytes = MAX_CACHED_BYTES
        self._pending: dict[tuple[Any, ...], asyncio.Task[Decision]] = {}
        self.reviews = 0  # SubjectAccessReviews sent

    async def check(self, user: User, attrs: Attributes) -> Decision:
        """Allowed or not, and why. PeerError when the review cannot be had."""
        if attrs.path in ALWAYS_ALLOWED_PATHS:
            return Decision(True, "always-allowed path")
        if PRIVILEGED_GROUP in user.groups:
            return Decision(True, f"member of {PRIVILEGED_GROUP}")
        key = (user.name, user.groups, tuple(sorted(user.extra.items())), attrs)
        now = self._monotonic()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            self._cache.move_to_end(key)
            return hit[1]
        review = self._pending.get(key)
        if review is None:  # the review is the authorizer's task: a caller that goes away
            review = self._pending[key] = asyncio.get_running_loop().create_task(
                self._review(key, user, attrs))  # (cancelled) does not cancel the others
        return await asyncio.shield(review)

    async def _review(self, key: tuple[Any, ...], user: User, attrs: Attributes) -> Decision:
        try:
            self.reviews += 1
            decision = decision_of(await self._api.create(
                "authorization.k8s.io/v1", "subjectaccessreviews", review_body(user, attrs)))
        finally:
            del self._pending[key]
        size = len(repr(key))  # once per review, not per request
        old = self._cache.pop(key, None)
        self._bytes += size - (old[2] if old else 0)
        self._cache[key] = (self._monotonic() + self._ttl[decision.allowed], decision, size)
        while len(self._cache) > self._max or self._bytes > self.max_bytes:
            self._bytes -= self._cache.popitem(last=False)[1][2]
        return decision
