"""gpuscale as the Helm chart installs it (``deploy/helm/gpuscale``, rendered by Helm's own
Go SDK through helm-python-sdk): plaintext streams for a trial (``tls.enabled=false``) and
the custom metrics API with a serving certificate of our own (``metricsApi.certManager=false``
and its ``caBundle``: no cert-manager here), the Secret it names made first."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml

from cluster.pki import Authority

CHART = Path(__file__).resolve().parent.parent / "deploy" / "helm" / "gpuscale"
NAMESPACE = "gpuscale"
SERVICE_DNS = f"gpuscale-metrics-api.{NAMESPACE}.svc"
NOT_INSTALLED_KINDS = ("Namespace",)  # made before, so the chart does not own it


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    from helm_python.chart import Chart

    out = Chart.load(CHART).render(values, name="gpuscale", namespace=NAMESPACE,
                                   is_install=True)
    return [d for text in out.values() for d in yaml.safe_load_all(text) if d]


def objects(directory: Path) -> list[dict[str, Any]]:
    """The namespace, the metrics API's Secret, and everything the chart renders."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = Authority(directory, "metrics-api-ca")
    pair = ca.issue("metrics-api", SERVICE_DNS,
                    hosts=(SERVICE_DNS, f"{SERVICE_DNS}.cluster.local"), client=False,
                    server=True)
    secret = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
              "metadata": {"name": "gpuscale-metrics-api-tls", "namespace": NAMESPACE},
              "data": {"tls.crt": base64.b64encode(pair.cert.read_bytes()).decode(),
                       "tls.key": base64.b64encode(pair.key.read_bytes()).decode()}}
    values = {"createNamespace": False, "tls": {"enabled": False},
              "metricsApi": {"enabled": True, "certManager": False,
                             "caBundle": base64.b64encode(ca.pair.cert.read_bytes()).decode()}}
    chart = [o for o in render(values) if o["kind"] not in NOT_INSTALLED_KINDS]
    return [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
            secret, *chart]
