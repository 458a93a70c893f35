"""The NetworkPolicies, rendered every way the deploy ships them (kustomize base and
overlays, Helm with its defaults and with other peers): each selects exactly its
workload's pods, and admits exactly one peer per port, on exactly the ports those pods
serve; the metrics API's port, whose client is the kube-apiserver, is open to every
source, and no other port is."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.deploy.rendered import DEPLOY, by_kind, helm_render, render
from tests.support.schemas import validate

Peer = dict[str, Any]


def ns_peer(namespace: str, **labels: str) -> Peer:
    peer: Peer = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name":
                                                        namespace}}}
    if labels:
        peer["podSelector"] = {"matchLabels": labels}
    return peer


KEDA = ns_peer("keda", app="keda-operator")
PROMETHEUS = ns_peer("monitoring")
SCALER_PODS = {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "gpuscale",
                                               "app.kubernetes.io/component": "scaler"}}}

# A rule without `from`, as ingress() records it.
ANYWHERE: Peer = {"ANY SOURCE": True}

# port name in the pod template -> who may reach it
SCALER_PEERS = {"grpc": KEDA, "metrics": PROMETHEUS}
# The kube-apiserver is not a pod; the port checks every request (mTLS, then a
# SubjectAccessReview).
WITH_METRICS_API = {**SCALER_PEERS, "metrics-api": ANYWHERE}
AGENT_PEERS = {"telemetry": SCALER_PODS, "metrics": PROMETHEUS}

RENDERINGS = {
    "kustomize/base": lambda: render("kustomize/base"),
    "kustomize/overlays/host-pid": lambda: render("kustomize/overlays/host-pid"),
    "kustomize/overlays/tls": lambda: render("kustomize/overlays/tls"),
    "kustomize/overlays/production": lambda: render("kustomize/overlays/production"),
    "helm defaults": lambda: helm_render(None),
    "helm plaintext": lambda: helm_render({"tls": {"enabled": False}}),
    "kustomize/overlays/metrics-api": lambda: render("kustomize/overlays/metrics-api"),
    "helm metricsApi": lambda: helm_render({"metricsApi": {"enabled": True}}),
    "helm metricsApi on 8443": lambda: helm_render({"metricsApi": {"enabled": True,
                                                                   "port": 8443}}),
}


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Kubernetes LabelSelector semantics (matchLabels and matchExpressions, ANDed)."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        key, op, values = e["key"], e["operator"], e.get("values", [])
        ok = {"In": key in labels and labels[key] in values,
              "NotIn": key not in labels or labels[key] not in values,
              "Exists": key in labels, "DoesNotExist": key not in labels}[op]
        if not ok:
            return False
    return True


def ingress(policy: dict[str, Any]) -> dict[tuple[str, int], list[Peer]]:
    """(protocol, port) -> the peers admitted to it. A rule without `from` admits every
    source and one without `ports` every port: both are recorded so that they fail the
    comparisons below (unless a port is meant to be open to every source: ANYWHERE)."""
    out: dict[tuple[str, int], list[Peer]] = {}
    for rule in policy["spec"].get("ingress", []):
        peers = rule.get("from") or [ANYWHERE]
        for port in rule.get("ports") or [{"port": "ANY PORT"}]:
            out.setdefault((port.get("protocol", "TCP"), port["port"]), []).extend(peers)
    return out


def check(objs: list[dict[str, Any]], scaler_peers: dict[str, Peer] = SCALER_PEERS,
          agent_peers: dict[str, Peer] = AGENT_PEERS) -> None:
    policies = {o["metadata"]["name"]: o for o in by_kind(tuple(objs), "NetworkPolicy")}
    assert set(policies) == {"gpuscale-scaler", "gpuscale-agent"}
    # Each policy's workloads: the scaler Deployment; the agent DaemonSets (NVIDIA, AMD).
    owned = {name: [o["spec"]["template"] for o in objs if o["kind"] == kind]
             for name, kind in (("gpuscale-scaler", "Deployment"),
                                ("gpuscale-agent", "DaemonSet"))}
    others = [o["spec"]["template"]["metadata"]["labels"] for o in objs
              if o["kind"] in ("Deployment", "DaemonSet", "StatefulSet")]
    for name, wanted in (("gpuscale-scaler", scaler_peers), ("gpuscale-agent", agent_peers)):
        policy = policies[name]
        validate(policy)
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        mine = [t["metadata"]["labels"] for t in owned[name]]
        # It selects its workloads' pods, and no other workload's.
        assert [x for x in others if selects(policy["spec"]["podSelector"], x)] == mine, name
        for template in owned[name]:
            # Every port those pods serve has exactly the one peer meant for it; no other
            # port is opened.
            ports = {p["name"]: (p.get("protocol", "TCP"), p["containerPort"])
                     for c in template["spec"]["containers"] for p in c.get("ports", [])}
            assert set(ports) == set(wanted), name
            assert ingress(policy) == {ports[n]: [peer] for n, peer in wanted.items()}, name
            # NetworkPolicies do not apply to host-network pods on most CNIs.
            assert not template["spec"].get("hostNetwork", False), name


@pytest.mark.parametrize("rendering", sorted(RENDERINGS))
def test_policies_admit_exactly_their_peers_on_exactly_their_ports(rendering: str) -> None:
    check(list(RENDERINGS[rendering]()),
          WITH_METRICS_API if "metricsApi" in rendering or "metrics-api" in rendering
          else SCALER_PEERS)


def test_the_stream_peer_is_the_scaler_deployments_own_pods() -> None:
    """9401's peer is a podSelector with no namespaceSelector: the scaler pods of this
    namespace, and only them."""
    objs = render("kustomize/base")
    scaler = by_kind(objs, "Deployment")[0]["spec"]["template"]["metadata"]["labels"]
    assert selects(SCALER_PODS["podSelector"], scaler)
    for ds in by_kind(objs, "DaemonSet"):  # the NVIDIA and the AMD agents
        assert not selects(SCALER_PODS["podSelector"], ds["spec"]["template"]["metadata"]["labels"])


def test_the_checks_catch_an_open_port_or_peer() -> None:
    """The comparisons above can fail: a rule with no `from`, one with no `ports`, a peer
    on the wrong port and an extra port are each rejected."""
    objs = list(render("kustomize/base"))

    def with_agent_ingress(rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = json.loads(json.dumps(objs))
        next(o for o in out if o["kind"] == "NetworkPolicy"
             and o["metadata"]["name"] == "gpuscale-agent")["spec"]["ingress"] = rules
        return out

    stream: dict[str, Any] = {"protocol": "TCP", "port": 9401}
    metrics: dict[str, Any] = {"protocol": "TCP", "port": 9400}
    prom = {"from": [PROMETHEUS], "ports": [metrics]}
    cases: list[list[dict[str, Any]]] = [
        [{"ports": [stream]}, prom],  # the stream open to every source
        [{"from": [SCALER_PODS]}, prom],  # every port open to the scalers
        [{"from": [PROMETHEUS], "ports": [stream]},  # peers swapped
         {"from": [SCALER_PODS], "ports": [metrics]}],
        [{"from": [SCALER_PODS], "ports": [stream, {"port": 22}]}, prom],  # a port too many
    ]
    for rules in cases:
        with pytest.raises(AssertionError):
            check(with_agent_ingress(rules))
    check(with_agent_ingress([{"from": [SCALER_PODS], "ports": [stream]}, prom]))


def test_helm_peers_are_configurable() -> None:
    keda = {"namespace": "keda-system",
            "podLabels": {"app": None, "app.kubernetes.io/name": "keda-operator"}}
    prometheus = {"namespace": "observability",
                  "podLabels": {"app.kubernetes.io/name": "prometheus"}}
    objs = helm_render({"networkPolicy": {"keda": keda, "prometheus": prometheus}})
    prom = ns_peer("observability", **{"app.kubernetes.io/name": "prometheus"})
    check(objs, {"grpc": ns_peer("keda-system", **{"app.kubernetes.io/name": "keda-operator"}),
                 "metrics": prom},
          {"telemetry": SCALER_PODS, "metrics": prom})
    # namespace "" is every namespace; podLabels {} every pod in it.
    objs = helm_render({"networkPolicy": {"prometheus": {"namespace": "", "podLabels": {}}}})
    check(objs, {"grpc": KEDA, "metrics": {"namespaceSelector": {}}},
          {"telemetry": SCALER_PODS, "metrics": {"namespaceSelector": {}}})
    assert not by_kind(tuple(helm_render({"networkPolicy": {"enabled": False}})),
                       "NetworkPolicy")


def test_helm_schema_refuses_an_unusable_peer() -> None:
    from helm_python.chart import Chart
    from helm_python.errors import HelmError

    chart = Chart.load(DEPLOY / "helm" / "gpuscale")
    chart.validate_schema({"networkPolicy": {"keda": {"namespace": "", "podLabels": {}}}})
    for bad, where in (({"keda": {"namespace": "Keda_NS", "podLabels": {}}}, "namespace"),
                       ({"prometheus": {"namespace": "monitoring",
                                        "podLabels": {"app": 1}}}, "podLabels"),
                       ({"keda": {"namespace": "keda", "podLabels": {}, "port": 1}}, "port")):
        with pytest.raises(HelmError, match=where):
            chart.validate_schema({"networkPolicy": bad})

