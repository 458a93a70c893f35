"""The HTTPS server of custom.metrics.k8s.io: authenticate, authorize, answer from memory.

Every request: who is asking (``authn``, from the TLS peer certificate and, for the front
proxy, the request headers; nobody: 401), whether they may (``authz``, a cached
SubjectAccessReview; no: 403 with the cluster's reason), then the answer (``answers``)
in the version's shape (``shapes``), or a Kubernetes Status: 400 for a request that cannot
be served, 404 for an unknown metric or object, 503 with the reason when the data is
missing or stale (the HPA keeps its replicas), 429 beyond ``max_in_flight`` requests;
a request that is not HTTP it reads (too long a line or header) a Status too, logged
sparingly, and the connections bounded (``guard``).
Only GET. The serving certificate and the trust ConfigMap are re-read while it runs, so
rotated certificates take effect without a restart.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import ssl
from collections.abc import Awaitable, Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

from aiohttp import web

from gpuscale.common.errors import ConfigError, DataUnavailable, GpuscaleError, PeerError
from gpuscale.metrics_api.answers import MetricAnswers
from gpuscale.metrics_api.authn import Authenticator, Trust, User, trust_from_configmap
from gpuscale.metrics_api.authz import Attributes, Authorizer
from gpuscale.metrics_api.guard import Guard, GuardedServer
from gpuscale.metrics_api.local import LocalAccess, check_loopback
from gpuscale.metrics_api.paths import GROUP, BadPath, Discovery, MetricPath, parse_path
from gpuscale.metrics_api.shapes import (
    group_document,
    group_list,
    resource_list,
    status,
    value_list,
)

log = logging.getLogger(__name__)

MAX_IN_FLIGHT = 1_000  # requests being answered at once (most wait for a review)
MAX_QUERY = 8_192  # bytes of query string (a label selector is at most 4,096)
MAX_FIELD = 8_190  # bytes of one header (aiohttp's default; Go's whole-head default is 1 MB)
TRUST_RETRY_S = (1.0, 2.0, 5.0, 10.0, 30.0)
RELOAD_S = 60.0  # how often the serving certificate and the trust ConfigMap are re-read
KEEPALIVE_S = 60.0  # an idle connection is closed after this (the aggregator reconnects)
AUTH_CONFIGMAP = ("kube-system", "extension-apiserver-authentication")


class TrustSource:
    """The current trust rules: fixed (tests, a file), or read from the ConfigMap."""

    def __init__(self, read: Callable[[], Awaitable[dict[str, str]]] | None = None,
                 trust: Trust | None = None) -> None:
        self._read = read
        self.trust = trust
        self.authenticate = Authenticator(trust) if trust else None
        self.error = "" if trust else "the trust ConfigMap has not been read yet"

    async def refresh(self) -> None:
        if self._read is None:
            return
        try:
            trust = trust_from_configmap(await self._read())
            if trust != self.trust:  # new rules: forget what the old ones decided
                self.trust, self.authenticate = trust, Authenticator(trust)
            self.error = ""
        except (ConfigError, PeerError) as exc:  # keep the last good rules
            self.error = f"{AUTH_CONFIGMAP[0]}/{AUTH_CONFIGMAP[1]}: {exc}"
            log.warning("metrics API: %s", self.error)


def server_context(cert: Path, key: Path, trust: Trust) -> ssl.SSLContext:
    """TLS 1.2+, the serving certificate, client certificates asked for and verified
    against both CAs (which one issued it is decided per request)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    ctx.verify_mode = ssl.CERT_OPTIONAL
    ctx.load_verify_locations(cadata=trust.pem().decode())
    return ctx


class MetricsApiServer:
    def __init__(self, answers: MetricAnswers, authorizer: Authorizer | None,
                 trust: TrustSource | None, cert: Path, key: Path, host: str = "0.0.0.0",
                 port: int = 6443, max_in_flight: int = MAX_IN_FLIGHT,
                 guard: Guard | None = None, local: LocalAccess | None = None) -> None:
        """``guard``: the bounds on connections and the log of malformed requests.
        ``local``: local mode (metrics_api.local): its token and its own certificate
        stand in for the cluster's authentication and authorization (``authorizer``
        and ``trust`` are then unused, and ``host`` must be loopback)."""
        if local is not None:
            check_loopback(host)
        elif authorizer is None or trust is None:
            raise ValueError("a cluster's metrics API needs its authorizer and trust")
        self.local = local
        self.answers = answers
        self.authorizer = authorizer
        self.trust = trust if trust is not None else TrustSource(trust=None)
        self._cert, self._key = cert, key
        self._host, self._port = host, port
        self._in_flight = 0
        self.max_in_flight = max_in_flight
        self._ctx: ssl.SSLContext | None = None
        self._stamp: tuple[int, ...] = ()
        self._trusted: Trust | None = None
        self.port = 0
        self.served: dict[int, int] = {}  # HTTP status -> answers
        self.guard = guard if guard is not None else Guard()

    # -- TLS material ----------------------------------------------------------------

    def _files_stamp(self) -> tuple[int, ...]:
        return tuple(p.stat().st_mtime_ns for p in (self._cert, self._key))

    def _reload(self) -> None:
        """Pick up a rotated serving certificate and new CAs for the handshake (new
        connections); a CA dropped from the ConfigMap stops authenticating at once (the
        per-request check), though the handshake keeps accepting its chain."""
        assert self._ctx is not None
        assert self.trust.trust is not None
        try:
            stamp = self._files_stamp()
            if stamp != self._stamp:
                # into a scratch context first: a half-written pair must not reach the live
                # one (every new handshake would fail until the next reload)
                ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(self._cert, self._key)
                self._ctx.load_cert_chain(self._cert, self._key)
                self._stamp = stamp
                log.info("metrics API: serving certificate (re)loaded")
            if self.trust.trust is not self._trusted:  # new CAs for new handshakes
                self._ctx.load_verify_locations(cadata=self.trust.trust.pem().decode())
                self._trusted = self.trust.trust
        except (OSError, ssl.SSLError, ValueError) as exc:
            log.warning("metrics API: keeping the current certificate: %s", exc)

    # -- serving -----------------------------------------------------------------------

    async def serve(self, on_listening: Callable[[int], None] | None = None) -> None:
        """Serve until cancelled. Until the trust rules can be read it does not listen
        (the APIService shows the check failing; the log says why), and retries: the KEDA
        service beside it keeps answering."""
        if self.local is not None:
            self._ctx = self.local.context()
        else:
            await self._await_trust()
            assert self.trust.trust is not None
            self._ctx = server_context(self._cert, self._key, self.trust.trust)
            self._trusted = self.trust.trust
        self._stamp = self._files_stamp()
        server = GuardedServer(self._handle, self.guard, max_field_size=MAX_FIELD,
                               handler_cancellation=True, access_log=None,
                               keepalive_timeout=KEEPALIVE_S, max_line_size=MAX_QUERY + 2048)
        runner = web.ServerRunner(server)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self._host, self._port, ssl_context=self._ctx,
                               backlog=1024)
            await site.start()
            self.port = int(runner.addresses[0][1])
            if on_listening is not None:
                on_listening(self.port)
            while True:
                await asyncio.sleep(RELOAD_S)
                if self.local is None:
                    await self.trust.refresh()
                    self._reload()
        finally:
            with suppress(Exception):
                await asyncio.shield(runner.cleanup())

    async def _await_trust(self) -> None:
        for delay in itertools.chain(TRUST_RETRY_S, itertools.repeat(TRUST_RETRY_S[-1])):
            await self.trust.refresh()
            if self.trust.trust is not None:
                return
            log.warning("metrics API: not serving until the trust rules can be read "
                        "(retry in %.0fs): %s", delay, self.trust.error)
            await asyncio.sleep(delay)

    def _reply(self, code: int, body: dict[str, Any]) -> web.Response:
        self.served[code] = self.served.get(code, 0) + 1
        return web.json_response(body, status=code)

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        if self._in_flight >= self.max_in_flight:
            return self._reply(429, status(429, f"more than {self.max_in_flight} requests "
                                                "in flight; retry"))
        self._in_flight += 1
        try:
            return await self._answer(request)
        except GpuscaleError as exc:
            code = 503 if isinstance(exc, (DataUnavailable, PeerError)) else exc.http_status
            return self._reply(code, status(code, str(exc)))
        except Exception:  # a bug: a Status all the same, and the trace in the log
            log.exception("metrics API: %s %s", request.method, request.path[:200])
            return self._reply(500, status(500, "internal error (logged by the scaler)"))
        finally:
            self._in_flight -= 1

    async def _answer(self, request: web.BaseRequest) -> web.Response:
        authenticate = (self.local.authenticate if self.local is not None
                        else self.trust.authenticate)
        assert authenticate is not None
        ssl_object = request.transport.get_extra_info("ssl_object") \
            if request.transport else None
        peer = ssl_object.getpeercert(binary_form=True) if ssl_object else None
        user = authenticate(peer, request.headers.items())
        if request.path in ("/healthz", "/livez", "/readyz") and request.method == "GET":
            return self._reply(200, {"status": "ok"})  # always allowed, as kube's are
        if user is None:
            return self._reply(401, status(401, "Unauthorized: present the token the local "
                                                "metrics API printed" if self.local else
                                                "Unauthorized: present a client certificate "
                                                "of the cluster CA, or come through the "
                                                "aggregation layer's front proxy"))
        if request.method != "GET":
            return self._reply(405, status(405, f"{request.method} is not supported; "
                                                "metrics are read with GET"))
        raw = request.raw_path.partition("?")[0]
        if len(request.query_string) > MAX_QUERY:
            raise BadPath(f"the query string is longer than {MAX_QUERY} bytes")
        target = parse_path(raw)
        checker = self.local if self.local is not None else self.authorizer
        assert checker is not None
        decision = await checker.check(user, _attributes(target, raw))
        if not decision.allowed:
            return self._reply(403, _forbidden(user, _attributes(target, raw),
                                               decision.reason))
        if isinstance(target, Discovery):
            doc = {"apis": group_list, "group": group_document}.get(target.level)
            return self._reply(200, doc() if doc else resource_list(target.version))
        return self._reply(200, self._metric(target, request))

    def _metric(self, target: MetricPath, request: web.BaseRequest) -> dict[str, Any]:
        label_selector = request.query.get("labelSelector", "")
        metric_selector = request.query.get("metricLabelSelector", "")
        if target.resource == "pods" and target.namespace:
            items = self.answers.pods(target.namespace, target.name, target.metric,
                                      label_selector, metric_selector)
        else:
            if target.name == "*" or not target.namespace:
                raise BadPath(f"the server could not find the metric {target.metric} for "
                              f"{target.resource} {target.name}: only pods are listed by "
                              "selector, and only namespaced objects are served", True)
            items = [self.answers.object(target.namespace, target.resource, target.name,
                                         target.metric, metric_selector)]
        return value_list(target.version, items)


def _attributes(target: Discovery | MetricPath, raw: str) -> Attributes:
    """What a request asks, as the API server's request-info resolver would put it."""
    if isinstance(target, Discovery):
        return Attributes("get", path=raw.rstrip("/") or "/")
    return Attributes("get", group=GROUP, version=target.version, resource=target.resource,
                      namespace=target.namespace, name=target.name, subresource=target.metric)


def _forbidden(user: User, attrs: Attributes, reason: str) -> dict[str, Any]:
    why = f": {reason}" if reason else ""
    return status(403, f'User "{user.name}" cannot {attrs.describe()}{why}')
