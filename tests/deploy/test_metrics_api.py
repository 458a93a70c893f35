"""The custom metrics API as deployed (kustomize overlays/metrics-api, Helm with
metricsApi.enabled): its calls granted through Kubernetes' built-in roles and nothing
without it, the HPA controller allowed to read it, and the serving certificate wired end to
end (cert-manager's chain -> Secret -> the scaler's flags -> Service -> APIServices)."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from gpuscale.kube import access
from tests.deploy.rendered import CA_BUNDLE, by_kind, helm_render, key, rbac_rules, render

Grant = tuple[str, str, frozenset[str]]
Objs = list[dict[str, Any]]

SCALER_SA = ("ServiceAccount", "gpuscale-scaler", "gpuscale")
HPA_CONTROLLER = ("ServiceAccount", "horizontal-pod-autoscaler", "kube-system")

# What Kubernetes' built-in roles for aggregated API servers grant (its RBAC bootstrap
# policy, plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go and
# namespace_policy.go). Every cluster has them, so the render only binds them:
# (kind, namespace of a Role, name) -> grants.
BUILT_IN: dict[tuple[str, str | None, str], set[Grant]] = {
    ("ClusterRole", None, "system:auth-delegator"): {
        ("authentication.k8s.io", "tokenreviews", frozenset({"create"})),
        ("authorization.k8s.io", "subjectaccessreviews", frozenset({"create"})),
    },
    ("Role", "kube-system", "extension-apiserver-authentication-reader"): {
        # resourceNames: [extension-apiserver-authentication], the one ConfigMap we read
        ("", "configmaps", frozenset({"get", "list", "watch"})),
    },
}

WITH_METRICS_API: dict[str, Callable[[], Objs]] = {
    "kustomize/overlays/metrics-api": lambda: list(render("kustomize/overlays/metrics-api")),
    "helm metricsApi": lambda: helm_render({"metricsApi": {"enabled": True}}),
    "helm metricsApi, own CA, no tls": lambda: helm_render(
        {"metricsApi": {"enabled": True, "certManager": False, "caBundle": CA_BUNDLE},
         "tls": {"enabled": False}}),
}
WITHOUT: dict[str, Callable[[], Objs]] = {
    "kustomize/overlays/production": lambda: list(render("kustomize/overlays/production")),
    "helm defaults": lambda: helm_render(None),
}


def built_in_grants(objs: Iterable[dict[str, Any]]) -> dict[str | None, set[Grant]]:
    """Scope (None: cluster-wide, else a namespace) -> what the scaler's ServiceAccount
    holds through the render's bindings to the built-in roles above."""
    out: dict[str | None, set[Grant]] = {}
    for binding in objs:
        if binding["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        if SCALER_SA not in {(s["kind"], s["name"], s.get("namespace"))
                             for s in binding["subjects"]}:
            continue
        scope = binding["metadata"]["namespace"] if binding["kind"] == "RoleBinding" else None
        ref = binding["roleRef"]
        role = (ref["kind"], scope if ref["kind"] == "Role" else None, ref["name"])
        if role in BUILT_IN:
            out.setdefault(scope, set()).update(BUILT_IN[role])
    return out


def covered(calls: Iterable[Grant], grants: set[Grant]) -> bool:
    return all(any((g, r) == (group, resource) and verbs <= v for g, r, v in grants)
               for group, resource, verbs in calls)


@pytest.mark.parametrize("rendering", sorted(WITH_METRICS_API))
def test_its_calls_are_granted_through_the_built_in_roles(rendering: str) -> None:
    grants = built_in_grants(WITH_METRICS_API[rendering]())
    cluster = grants.get(None, set())
    assert covered(access.METRICS_API, cluster)
    assert covered(access.METRICS_API_KUBE_SYSTEM, cluster | grants.get("kube-system", set()))


@pytest.mark.parametrize("rendering", sorted(WITHOUT))
def test_without_it_the_scaler_holds_none_of_them(rendering: str) -> None:
    grants = built_in_grants(WITHOUT[rendering]())
    assert grants == {}
    assert not covered(access.METRICS_API, grants.get(None, set()))


@pytest.mark.parametrize("rendering", sorted(WITH_METRICS_API))
def test_the_hpa_controller_may_read_it(rendering: str) -> None:
    """As prometheus-adapter's manifests do: the HPA controller's ServiceAccount (the
    controller-manager's per-controller credentials) may get and list the API, which the
    scaler checks with a SubjectAccessReview on every request."""
    objs = WITH_METRICS_API[rendering]()
    role = next(o for o in objs if key(o) == ("ClusterRole", "gpuscale-custom-metrics-reader"))
    assert rbac_rules(role) == {("custom.metrics.k8s.io", "*", frozenset({"get", "list"}))}
    bound = [{(s["kind"], s["name"], s.get("namespace")) for s in b["subjects"]}
             for b in by_kind(tuple(objs), "ClusterRoleBinding")
             if b["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                 "name": "gpuscale-custom-metrics-reader"}]
    assert bound == [{HPA_CONTROLLER}]


def hours(duration: str) -> float:
    """A Go duration as cert-manager takes it ("2160h", "1h30m") in hours."""
    parts = re.fullmatch(r"((\d+)h)?((\d+)m)?((\d+)s)?", duration)
    assert duration
    assert parts, duration
    h, m, s = (int(parts.group(i) or 0) for i in (2, 4, 6))
    return h + m / 60 + s / 3600


def one(objs: Objs, kind: str, namespace: str | None, name: str) -> dict[str, Any]:
    found = [o for o in objs if (o["kind"], o["metadata"].get("namespace"),
                                 o["metadata"]["name"]) == (kind, namespace, name)]
    assert len(found) == 1, (kind, namespace, name)
    return found[0]


def check_serving_chain(objs: Objs) -> None:
    """AssertionError unless the aggregator can reach the scaler's metrics API and trust
    its certificate: the APIServices name a Service whose 443 reaches the port the scaler
    serves on, with the certificate and key from one mounted Secret, which either
    cert-manager issues (for the Service's DNS name, from a CA chain of Issuers in the
    render, the CA injected into the APIServices) or the APIServices carry the CA of."""
    deploy = next(o for o in objs if key(o) == ("Deployment", "gpuscale-scaler"))
    namespace, pod = deploy["metadata"]["namespace"], deploy["spec"]["template"]
    (scaler,) = pod["spec"]["containers"]
    flags = dict(a.split("=", 1) for a in scaler["args"] if a.startswith("--metrics-api-"))
    port = int(flags["--metrics-api-port"])
    assert {p["name"]: p["containerPort"] for p in scaler["ports"]}["metrics-api"] == port
    mount = next(m for m in scaler["volumeMounts"]
                 if flags["--metrics-api-cert"] == m["mountPath"] + "/tls.crt")
    assert flags["--metrics-api-key"] == mount["mountPath"] + "/tls.key"
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == mount["name"])
    secret = volume["secret"]["secretName"]

    apis = {s["spec"]["version"]: s for s in by_kind(tuple(objs), "APIService")}
    assert set(apis) == {"v1beta2", "v1beta1"}
    assert apis["v1beta2"]["spec"]["versionPriority"] > apis["v1beta1"]["spec"]["versionPriority"]
    refs = set()
    for version, api in apis.items():
        spec = api["spec"]
        assert api["metadata"]["name"] == f"{version}.custom.metrics.k8s.io"
        assert (spec["group"], spec["groupPriorityMinimum"]) == ("custom.metrics.k8s.io", 100)
        assert spec["insecureSkipTLSVerify"] is False
        refs.add((spec["service"]["namespace"], spec["service"]["name"], spec["service"]["port"]))
    assert len(refs) == 1, refs
    ((svc_ns, svc_name, svc_port),) = refs
    assert (svc_ns, svc_port) == (namespace, 443)
    service = one(objs, "Service", svc_ns, svc_name)
    assert [p["targetPort"] for p in service["spec"]["ports"] if p["port"] == 443] == \
        ["metrics-api"]
    labels = pod["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()

    injected = {a["metadata"].get("annotations", {}).get("cert-manager.io/inject-ca-from")
                for a in apis.values()}
    if injected == {None}:  # no cert-manager: the CA comes with the APIServices
        assert not by_kind(tuple(objs), "Certificate")
        for api in apis.values():
            assert base64.b64decode(api["spec"]["caBundle"], validate=True)
        return
    assert len(injected) == 1, injected
    ((leaf_ns, leaf_name),) = [tuple(str(i).split("/")) for i in injected]
    leaf = one(objs, "Certificate", leaf_ns, leaf_name)["spec"]
    assert not [a for a in apis.values() if "caBundle" in a["spec"]]
    assert leaf_ns == namespace
    assert leaf["secretName"] == secret
    assert f"{svc_name}.{svc_ns}.svc" in leaf["dnsNames"]
    assert "server auth" in leaf["usages"]
    assert 0 < hours(leaf["renewBefore"]) < hours(leaf["duration"])
    # leaf <- CA Issuer <- CA Certificate <- self-signed Issuer, all in the render
    for cert in by_kind(tuple(objs), "Certificate"):
        ref = cert["spec"]["issuerRef"]
        assert (ref.get("group", "cert-manager.io"), ref["kind"]) == ("cert-manager.io", "Issuer")
        one(objs, "Issuer", cert["metadata"]["namespace"], ref["name"])
    ca_issuer = one(objs, "Issuer", namespace, leaf["issuerRef"]["name"])["spec"]["ca"]
    (ca,) = [c["spec"] for c in by_kind(tuple(objs), "Certificate")
             if c["metadata"]["namespace"] == namespace
             and c["spec"]["secretName"] == ca_issuer["secretName"]]
    assert ca.get("isCA") is True
    assert ca["privateKey"].get("rotationPolicy") == "Never"  # renewed, still verifies leaves
    assert hours(ca["duration"]) > hours(leaf["duration"])
    root = one(objs, "Issuer", namespace, ca["issuerRef"]["name"])["spec"]
    assert root == {"selfSigned": {}}


@pytest.mark.parametrize("rendering", sorted(WITH_METRICS_API))
def test_the_serving_certificate_is_wired_end_to_end(rendering: str) -> None:
    check_serving_chain(WITH_METRICS_API[rendering]())


def test_the_chain_check_catches_a_broken_link() -> None:
    objs = list(render("kustomize/overlays/metrics-api"))
    check_serving_chain(objs)

    def broken(kind: str, name: str, path: str, value: Any) -> Objs:
        out: Objs = json.loads(json.dumps(objs))
        node: Any = next(o for o in out if key(o) == (kind, name))
        *parents, last = path.split("/")
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        node[last] = value
        return out

    cases = [
        ("Certificate", "gpuscale-metrics-api", "spec/secretName", "other-tls"),
        ("Certificate", "gpuscale-metrics-api", "spec/dnsNames", ["gpuscale-scaler.gpuscale.svc"]),
        ("Certificate", "gpuscale-metrics-api", "spec/issuerRef/name", "missing"),
        ("Issuer", "gpuscale-metrics-api-ca", "spec/ca/secretName", "gpuscale-metrics-api-tls"),
        ("Certificate", "gpuscale-metrics-api-ca", "spec/privateKey/rotationPolicy", "Always"),
        ("APIService", "v1beta1.custom.metrics.k8s.io", "spec/service/port", 6443),
        ("APIService", "v1beta1.custom.metrics.k8s.io", "spec/versionPriority", 300),
        ("APIService", "v1beta2.custom.metrics.k8s.io", "metadata/annotations",
         {"cert-manager.io/inject-ca-from": "gpuscale/gpuscale-metrics-api-ca"}),
        ("Service", "gpuscale-metrics-api", "spec/ports/0/targetPort", "grpc"),
        ("Deployment", "gpuscale-scaler", "spec/template/spec/volumes/1/secret/secretName",
         "other-tls"),
    ]
    for case in cases:
        with pytest.raises(AssertionError):
            check_serving_chain(broken(*case))
