"""The metrics API's pure parts: Quantity strings, request paths, the trust ConfigMap,
who a certificate and headers make, and the SubjectAccessReview cache."""

from __future__ import annotations

import asyncio
from contextlib import suppress
from dataclasses import replace
from decimal import Decimal, localcontext
from typing import Any

import pytest
from cryptography import x509
from hypothesis import given
from hypothesis import strategies as st

from gpuscale.common.errors import ConfigError, PeerError
from gpuscale.metrics_api.authn import Authenticator, User, authenticate, trust_from_configmap
from gpuscale.metrics_api.authz import Attributes, Authorizer, decision_of
from gpuscale.metrics_api.paths import BadPath, Discovery, MetricPath, parse_path
from gpuscale.metrics_api.quantity import parse_quantity, quantity
from gpuscale.scaler.answers import Answers
from tests.support.pki import issue, make_ca, pem

# -- quantities ----------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "text"), [
    (0.0, "0"), (0.5, "500m"), (0.1, "100m"), (3.0, "3"), (1.5, "1500m"), (1000.0, "1k"),
    (1500000.0, "1500k"), (2e6, "2M"), (73.25, "73250m"), (1e-9, "1m"), (0.0004, "1m"),
    (12345.6789, "12345679m"), (-0.5, "-500m"),
])
def test_quantities_are_canonical_and_rounded_up(value: float, text: str) -> None:
    assert quantity(value) == text


@given(st.floats(min_value=0, max_value=1e12, allow_nan=False))
def test_a_quantity_is_never_below_the_value_nor_a_milli_above(value: float) -> None:
    read = parse_quantity(quantity(value))
    with localcontext() as ctx:
        ctx.prec = 400  # exact arithmetic for tiny values
        exact = Decimal(repr(value))
        assert exact <= read < exact + Decimal("0.001")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_values_that_are_not_finite_have_no_quantity(bad: float) -> None:
    with pytest.raises(ValueError, match="finite"):
        quantity(bad)


# -- paths --------------------------------------------------------------------------------


def test_paths_the_hpa_client_builds() -> None:
    assert parse_path("/apis") == Discovery("apis")
    assert parse_path("/apis/custom.metrics.k8s.io/") == Discovery("group")
    assert parse_path("/apis/custom.metrics.k8s.io/v1beta1") == Discovery("version", "v1beta1")
    assert parse_path("/apis/custom.metrics.k8s.io/v1beta2/namespaces/llm/pods/*/"
                      "vllm:num_requests_waiting") == \
        MetricPath("v1beta2", "llm", "pods", "*", "vllm:num_requests_waiting")
    assert parse_path("/apis/custom.metrics.k8s.io/v1beta2/namespaces/llm/deployments.apps/"
                      "v%2Dx/gpuscale_gpu_utilization") == \
        MetricPath("v1beta2", "llm", "deployments.apps", "v-x", "gpuscale_gpu_utilization")
    assert parse_path("/apis/custom.metrics.k8s.io/v1beta2/namespaces/llm/metrics/m") == \
        MetricPath("v1beta2", "", "namespaces", "llm", "m")


@given(st.text(max_size=300))
def test_any_path_parses_or_is_refused_clearly(raw: str) -> None:
    """No path escapes its segment, and nothing but BadPath comes out."""
    path = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/llm/pods/" + raw
    try:
        got = parse_path(path)
    except BadPath as exc:
        status = exc.http_status
    else:
        status = 200
        assert isinstance(got, MetricPath)
        assert "/" not in got.name
        assert got.name not in (".", "..")
    assert status in (200, 400, 404)


def test_long_paths_are_refused() -> None:
    with pytest.raises(BadPath, match="longer than"):
        parse_path("/apis/custom.metrics.k8s.io/v1beta2/" + "a" * 5000)


# -- the trust ConfigMap ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def cas() -> dict[str, Any]:
    return {"cluster": make_ca("kubernetes"), "proxy": make_ca("front-proxy-ca")}


def data(cas: dict[str, Any], **over: str) -> dict[str, str]:
    base = {"client-ca-file": pem(cas["cluster"][0]).decode(),
            "requestheader-client-ca-file": pem(cas["proxy"][0]).decode(),
            "requestheader-allowed-names": '["front-proxy-client"]',
            "requestheader-username-headers": '["X-Remote-User"]',
            "requestheader-group-headers": '["X-Remote-Group"]',
            "requestheader-extra-headers-prefix": '["X-Remote-Extra-"]'}
    return {**base, **over}


@pytest.mark.parametrize(("over", "words"), [
    ({"client-ca-file": "not a pem", "requestheader-client-ca-file": ""}, "client-ca-file"),
    ({"requestheader-allowed-names": "front-proxy-client"}, "JSON list of strings"),
    ({"requestheader-username-headers": '[1, 2]'}, "JSON list of strings"),
    ({"client-ca-file": "", "requestheader-client-ca-file": ""}, "nobody could be"),
])
def test_a_configmap_that_cannot_be_read_is_a_clear_error(
        cas: dict[str, Any], over: dict[str, str], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        trust_from_configmap(data(cas, **over))


@given(st.dictionaries(st.sampled_from([
    "client-ca-file", "requestheader-client-ca-file", "requestheader-allowed-names",
    "requestheader-username-headers", "requestheader-group-headers",
    "requestheader-extra-headers-prefix"]), st.text(max_size=200)))
def test_hostile_configmaps_are_refused_or_read(values: dict[str, str]) -> None:
    with suppress(ConfigError):  # anything else (a crash) fails the test
        trust_from_configmap(values)


def der(leaf: tuple[bytes, bytes]) -> bytes:
    from cryptography.hazmat.primitives.serialization import Encoding

    return x509.load_pem_x509_certificate(leaf[0]).public_bytes(Encoding.DER)


def test_who_a_request_is(cas: dict[str, Any]) -> None:
    trust = trust_from_configmap(data(cas))
    proxy = der(issue(cas["proxy"], "front-proxy-client", client=True))
    client = der(issue(cas["cluster"], "carol", client=True, orgs=("devs", "ops")))
    headers = [("X-Remote-User", "alice"), ("X-Remote-Group", "a"), ("x-remote-group", "b"),
               ("X-Remote-Extra-Acme.com%2Fproject", "p1")]
    assert authenticate(trust, proxy, headers) == User(
        "alice", ("a", "b", "system:authenticated"), {"acme.com/project": ("p1",)},
        "front proxy")
    assert authenticate(trust, client, headers) == User(
        "carol", ("devs", "ops", "system:authenticated"))
    assert authenticate(trust, None, headers) is None
    assert authenticate(trust, b"\x30\x03garbage", headers) is None
    # no allowed-names list: any front-proxy CN is the proxy
    open_trust = trust_from_configmap(data(cas, **{"requestheader-allowed-names": "[]"}))
    other = der(issue(cas["proxy"], "another-proxy", client=True))
    assert authenticate(open_trust, other, headers) is not None
    assert authenticate(trust, other, headers) is None


def test_hostile_headers_are_bounded(cas: dict[str, Any]) -> None:
    trust = trust_from_configmap(data(cas))
    proxy = der(issue(cas["proxy"], "front-proxy-client", client=True))
    many = [("X-Remote-User", "alice")] + [("X-Remote-Group", f"g{i}") for i in range(100)]
    with pytest.raises(ConfigError, match="more than 64"):
        authenticate(trust, proxy, many)


# -- reviews ----------------------------------------------------------------------------------


class Reviews:
    def __init__(self, reply: dict[str, Any] | Exception) -> None:
        self.reply = reply
        self.calls = 0
        self.gate = asyncio.Event()
        self.gate.set()

    async def create(self, api_version: str, resource: str,
                     body: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        await self.gate.wait()
        if isinstance(self.reply, Exception):
            raise self.reply
        return {**body, "status": self.reply}


ATTRS = Attributes("get", group="custom.metrics.k8s.io", version="v1beta2",
                   resource="pods", namespace="llm", name="*", subresource="gpu_utilization")


async def test_concurrent_questions_share_one_review() -> None:
    api = Reviews({"allowed": True})
    api.gate.clear()
    authz = Authorizer(api)
    tasks = [asyncio.create_task(authz.check(User("hpa", ()), ATTRS)) for _ in range(100)]
    await asyncio.sleep(0.01)
    api.gate.set()
    decisions = await asyncio.gather(*tasks)
    assert all(d.allowed for d in decisions)
    assert api.calls == 1


async def test_cache_expires_and_failures_are_not_cached() -> None:
    now = [0.0]
    api = Reviews(PeerError("POST subjectaccessreviews: API error 500"))
    authz = Authorizer(api, monotonic=lambda: now[0])
    for _ in range(2):
        with pytest.raises(PeerError):
            await authz.check(User("hpa", ()), ATTRS)
    assert api.calls == 2
    api.reply = {"allowed": False, "reason": "no"}
    assert not (await authz.check(User("hpa", ()), ATTRS)).allowed
    assert not (await authz.check(User("hpa", ()), ATTRS)).allowed
    assert api.calls == 3
    now[0] = 11.0
    await authz.check(User("hpa", ()), ATTRS)
    assert api.calls == 4
    assert (await authz.check(User("x", ("system:masters",)), ATTRS)).allowed
    assert (await authz.check(User("x", ()), Attributes("get", path="/healthz"))).allowed
    assert api.calls == 4


async def test_different_questions_get_their_own_decisions() -> None:
    class ByUser(Reviews):
        async def create(self, api_version: str, resource: str,
                         body: dict[str, Any]) -> dict[str, Any]:
            self.calls += 1
            spec = body["spec"]
            ok = spec["user"] == "alice" and "ops" in spec.get("groups", []) and \
                spec["resourceAttributes"]["namespace"] == "llm"
            return {**body, "status": {"allowed": ok}}

    authz = Authorizer(ByUser({}))
    other_ns = replace(ATTRS, namespace="other")
    assert (await authz.check(User("alice", ("ops",)), ATTRS)).allowed
    assert not (await authz.check(User("alice", ()), ATTRS)).allowed
    assert not (await authz.check(User("bob", ("ops",)), ATTRS)).allowed
    assert not (await authz.check(User("alice", ("ops",)), other_ns)).allowed


async def test_a_caller_that_goes_away_does_not_cancel_the_others() -> None:
    api = Reviews({"allowed": True})
    api.gate.clear()
    authz = Authorizer(api)
    first_caller = asyncio.create_task(authz.check(User("hpa", ()), ATTRS))
    second = asyncio.create_task(authz.check(User("hpa", ()), ATTRS))
    await asyncio.sleep(0.01)
    first_caller.cancel()
    api.gate.set()
    assert (await second).allowed
    assert api.calls == 1


def test_cache_is_bounded_in_entries_and_bytes() -> None:
    async def go() -> None:
        api = Reviews({"allowed": True})
        authz = Authorizer(api, max_cached=10)
        for i in range(50):
            await authz.check(User(f"u{i}", ()), ATTRS)
        assert len(authz._cache) == 10
        authz = Authorizer(api)
        authz.max_bytes = 20_000
        groups = tuple(f"g{i}-" + "x" * 900 for i in range(5))  # ~5 KB of key each
        for i in range(20):
            await authz.check(User(f"u{i}", groups), ATTRS)
        assert 0 < len(authz._cache) <= 4
        assert authz._bytes <= 20_000

    asyncio.run(go())


@pytest.mark.parametrize(("reply", "allowed"), [
    ({"status": {"allowed": True}}, True),
    ({"status": {"allowed": True, "denied": True}}, False),
    ({"status": {"allowed": False, "evaluationError": "rbac down"}}, False),
])
def test_decisions(reply: dict[str, Any], allowed: bool) -> None:
    assert decision_of(reply).allowed is allowed


@pytest.mark.parametrize("reply", [{}, {"status": "yes"}, {"status": {"allowed": "true"}}])
def test_replies_without_a_decision_are_peer_errors(reply: dict[str, Any]) -> None:
    with pytest.raises(PeerError):
        decision_of(reply)


def test_the_authenticator_remembers_certificates_not_headers(cas: dict[str, Any]) -> None:
    """A connection's certificate is checked once; the user still comes from each
    request's headers, and the cache stays bounded."""
    trust = trust_from_configmap(data(cas))
    auth = Authenticator(trust, max_cached=2)
    proxy = der(issue(cas["proxy"], "front-proxy-client", client=True))
    for user in ("alice", "bob"):
        assert auth(proxy, [("X-Remote-User", user)]) == \
            authenticate(trust, proxy, [("X-Remote-User", user)])
    assert auth(proxy, []) is None
    for i in range(5):
        leaf = der(issue(cas["cluster"], f"u{i}", client=True))
        assert auth(leaf, [("X-Remote-User", "alice")]) == User(f"u{i}",
                                                                ("system:authenticated",))
    assert len(auth._peers) <= 2


def test_planners_from_metric_selectors_take_a_bounded_part_of_the_plan_book(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Readers of the API choose the planner's settings (the metric selector): each new
    setting would be a planner in the book KEDA's planners share. Ours stop at MAX_PLANS."""
    from gpuscale.metrics_api import answers as mod
    from gpuscale.scaler.core.selector import parse_selector
    from gpuscale.scaler.state.fleet import FleetView
    from gpuscale.scaler.state.plan_book import PlanBook, TooManyPlans

    monkeypatch.setattr(mod, "MAX_PLANS", 3)

    class Deployment:
        def target(self, namespace: str, kind: str, name: str) -> Any:
            return parse_selector("app=vllm")

    book = PlanBook()
    answers = mod.MetricAnswers(Answers(FleetView(), plans=book), Deployment())
    for startup in (100, 110, 120):
        answers.object("llm", "deployments.apps", "vllm", "gpuscale_planned_replicas",
                       f"startupSeconds={startup}")
    with pytest.raises(TooManyPlans, match="limit 3"):
        answers.object("llm", "deployments.apps", "vllm", "gpuscale_planned_replicas",
                       "startupSeconds=130")
    answers.object("llm", "deployments.apps", "vllm", "gpuscale_planned_replicas",
                   "startupSeconds=110")  # an existing one still answers
    assert len(book) == 3
