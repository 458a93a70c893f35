"""The Helm chart in deploy/helm/gpuscale: its defaults and switches render what the
kustomize overlays do, every combination of values validates, lint and the values schema
refuse what cannot work, and the scaler's Service is headless unless asked otherwise."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

from tests.deploy.rendered import (
    AGENTS,
    CA_BUNDLE,
    DEPLOY,
    by_kind,
    container_args,
    helm_render,
    key,
    named,
    render,
)
from tests.support.schemas import validate

HELM_COMBINATIONS = {
    "defaults": None,
    "host-pid": {"agent": {"hostPID": True, "runtimeClassName": "nvidia"},
                 "tls": {"enabled": False}},
    "tls": {"tls": {"enabled": True}},
    "metrics-api-own-ca": {"metricsApi": {"enabled": True, "certManager": False,
                                          "caBundle": CA_BUNDLE}},
    "minimal": {"createNamespace": False, "networkPolicy": {"enabled": False},
                "serviceMonitor": {"enabled": False}, "prometheusRule": {"enabled": False},
                "scaler": {"replicas": 3}, "agent": {"interval": 0.5}},
    "answer-process": {"scaler": {"answerProcess": True}},
}


@pytest.mark.parametrize(("values", "path"), [
    (None, "kustomize/overlays/production"),
    ({"tls": {"enabled": False}}, "kustomize/base"),
    ({"metricsApi": {"enabled": True}}, "kustomize/overlays/metrics-api"),
])
def test_helm_renders_what_kustomize_does(values: dict[str, Any] | None, path: str) -> None:
    """Helm's defaults are the production overlay; tls.enabled=false is the plain base;
    metricsApi.enabled=true is the metrics-api overlay (cert-manager included)."""
    helm = sorted(helm_render(values), key=key)
    kustomize = sorted(render(path), key=key)
    assert [key(o) for o in helm] == [key(o) for o in kustomize]
    for h, k in zip(helm, kustomize, strict=True):
        assert h == k, key(h)


@pytest.mark.parametrize("combo", sorted(HELM_COMBINATIONS))
def test_helm_value_combinations_validate(combo: str) -> None:
    objs = helm_render(HELM_COMBINATIONS[combo])
    for obj in objs:
        validate(obj)
    kinds = {o["kind"] for o in objs}
    if combo == "minimal":
        assert not kinds & {"Namespace", "NetworkPolicy", "ServiceMonitor", "PrometheusRule"}
    if combo == "metrics-api-own-ca":  # no cert-manager: the CA comes from the values
        assert not kinds & {"Issuer", "Certificate"}
        services = by_kind(tuple(objs), "APIService")
        assert [s["spec"]["caBundle"] for s in services] == [CA_BUNDLE, CA_BUNDLE]
        assert not [s for s in services if "annotations" in s["metadata"]]
    if combo == "answer-process":  # the flag the CLI has, on the scaler only
        args = container_args(objs)
        assert args.count("--answer-process") == 1
        scaler = named(objs, "Deployment", "gpuscale-scaler")
        assert "--answer-process" in scaler["spec"]["template"]["spec"]["containers"][0]["args"]
    if combo in ("tls", "host-pid"):
        overlay = sorted(render(f"kustomize/overlays/{combo}"), key=key)
        for name in AGENTS:
            ds = named(overlay, "DaemonSet", name)
            helm_ds = named(objs, "DaemonSet", name)
            assert helm_ds["spec"]["template"]["spec"].get("hostPID") == \
                ds["spec"]["template"]["spec"].get("hostPID")
            assert helm_ds["spec"]["template"]["spec"]["containers"][0]["args"] == \
                ds["spec"]["template"]["spec"]["containers"][0]["args"]


def test_helm_lint_and_values_schema() -> None:
    from helm_python.chart import Chart, lint
    from helm_python.errors import HelmError

    for values in (None, {"metricsApi": {"enabled": True}},
                   HELM_COMBINATIONS["metrics-api-own-ca"]):
        report = lint(DEPLOY / "helm" / "gpuscale", values, strict=True, namespace="gpuscale")
        assert report["errors"] == [], values
        assert [m for m in report["messages"] if m["severity"] >= 2] == [], values
    chart = Chart.load(DEPLOY / "helm" / "gpuscale")
    chart.validate_schema({"scaler": {"replicas": 2}})
    for bad, where in (({"scaler": {"replicas": 0}}, "/scaler/replicas"),
                       ({"agent": {"interval": 0.05}}, "/agent/interval"),
                       ({"tls": {"enabled": "yes"}}, "/tls/enabled"),
                       ({"metricsApi": {"port": 443}}, "/metricsApi/port"),  # runs as non-root
                       ({"metricsApi": {"enabled": True, "certManager": False}},
                        "/metricsApi/caBundle"),  # the APIServices would trust nothing
                       ({"metricsApi": {"caBundle": "-----BEGIN"}}, "/metricsApi/caBundle"),
                       ({"unknown": 1}, "unknown")):
        with pytest.raises(HelmError, match=where):
            chart.validate_schema(bad)


def test_the_scaler_service_is_headless_unless_asked_otherwise() -> None:
    """KEDA's client resolves scalerAddress with gRPC's DNS resolver and round_robin: a
    headless Service lets it spread calls and streams over every Ready replica; the port
    is then the pod's own, so the Service's ports must equal the container's."""
    def scaler_service(objs: Iterable[dict[str, Any]]) -> dict[str, Any]:
        return next(o for o in objs if o["kind"] == "Service"
                    and o["metadata"]["name"] == "gpuscale-scaler")

    for objs in (render("kustomize/base"), helm_render(None)):
        svc = scaler_service(objs)
        assert svc["spec"]["clusterIP"] == "None"
        deployment = next(o for o in objs if o["kind"] == "Deployment"
                          and o["metadata"]["name"] == "gpuscale-scaler")
        ports = {p["name"]: p["containerPort"] for c in
                 deployment["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
        assert all(ports[p["targetPort"]] == p["port"] for p in svc["spec"]["ports"])
    assert "clusterIP" not in scaler_service(helm_render(
        {"scaler": {"headless": False}}))["spec"]


GATEWAY = {"demandSources": [{
    "name": "gateway", "kind": "metrics", "url": "http://gateway.llm:9090/metrics",
    "metric": "gateway_pending_requests", "labels": {"workload": "llm/vllm"}}]}


def test_the_scalers_configuration_is_a_value(tmp_path: Any) -> None:
    """``scaler.config`` becomes the file ``--config`` reads (the scaler's own loader
    accepts what the chart writes), mounted read-only; a new configuration rolls the pods;
    without it there is no ConfigMap and no ``--config``."""
    from gpuscale.scaler.config import load_file

    objs = helm_render({"scaler": {"config": GATEWAY}})
    text = named(objs, "ConfigMap", "gpuscale-scaler-config")["data"]["scaler.yaml"]
    (tmp_path / "scaler.yaml").write_text(text)
    demand, _ = load_file(tmp_path / "scaler.yaml")
    assert [s.name for s in demand.demand_sources] == ["gateway"]
    pod = named(objs, "Deployment", "gpuscale-scaler")["spec"]["template"]
    container = pod["spec"]["containers"][0]
    assert "--config=/etc/gpuscale/scaler.yaml" in container["args"]
    assert {"name": "scaler-config", "mountPath": "/etc/gpuscale", "readOnly": True} in \
        container["volumeMounts"]
    assert {"name": "scaler-config", "configMap": {"name": "gpuscale-scaler-config"}} in \
        pod["spec"]["volumes"]
    other = {"demandSources": [{**GATEWAY["demandSources"][0], "name": "queue"}]}
    rolled = named(helm_render({"scaler": {"config": other}}), "Deployment",
                   "gpuscale-scaler")["spec"]["template"]["metadata"]["annotations"]
    assert rolled != pod["metadata"]["annotations"]
    plain = helm_render({"tls": {"enabled": False}})
    assert not [o for o in plain if o["kind"] == "ConfigMap"
                and o["metadata"]["name"] == "gpuscale-scaler-config"]
    args = named(plain, "Deployment", "gpuscale-scaler")["spec"]["template"]["spec"][
        "containers"][0]["args"]
    assert not [a for a in args if a.startswith("--config")]
