"""Manifests checked against the Kubernetes schemas of a pinned version (through
kubernetes_validate) and against the published CRDs in tests/schemas (jsonschema)."""

from __future__ import annotations

from functools import cache
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

from tests.support.repo import SCHEMAS

K8S_VERSION = "1.33.0"  # the oldest Kubernetes release the manifests promise to support
CRDS = {
    ("keda.sh/v1alpha1", "ScaledObject"): "keda.sh_scaledobjects.yaml",
    ("keda.sh/v1alpha1", "TriggerAuthentication"): "keda.sh_triggerauthentications.yaml",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "monitoring.coreos.com_servicemonitors.yaml",
    ("monitoring.coreos.com/v1", "PodMonitor"): "monitoring.coreos.com_podmonitors.yaml",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "monitoring.coreos.com_prometheusrules.yaml",
}
# Kinds whose schemas tests/schemas does not hold: the KEDA HTTP add-on's, and
# cert-manager's (overlays/metrics-api); test_metrics_api checks the fields these objects
# are there for (issuer chain, Secret, DNS names) instead.
NOT_OURS = {("http.keda.sh/v1alpha1", "HTTPScaledObject"),
            ("cert-manager.io/v1", "Issuer"), ("cert-manager.io/v1", "Certificate")}


def _python_patterns(node: Any) -> Any:
    """CRD schemas carry Go regexes; Python wants inline flags first (``^(?i)x`` ->
    ``(?i)^x``), the only difference these schemas hit."""
    if isinstance(node, dict):
        out = {k: _python_patterns(v) for k, v in node.items()}
        if isinstance(out.get("pattern"), str) and out["pattern"].startswith("^(?i)"):
            out["pattern"] = "(?i)^" + out["pattern"][len("^(?i)"):]
        return out
    if isinstance(node, list):
        return [_python_patterns(v) for v in node]
    return node


@cache
def crd_schema(api_version: str, kind: str) -> dict[str, Any]:
    crd = yaml.safe_load((SCHEMAS / CRDS[(api_version, kind)]).read_text())
    version = api_version.split("/")[1]
    schema = next(v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"]
                  if v["name"] == version)
    return dict(_python_patterns(schema))


def validate(obj: dict[str, Any]) -> None:
    key = (obj["apiVersion"], obj["kind"])
    if key in CRDS:
        jsonschema.validate(obj, crd_schema(*key))
    elif key not in NOT_OURS:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
