"""The manifests in deploy/ as the tests read them: kustomize renderings (``render``), the
Helm chart's (``helm_render``), and what the tests look for in them."""

from __future__ import annotations

import base64
import shutil
import subprocess
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
DASHBOARD = DEPLOY / "helm" / "gpuscale" / "dashboards" / "gpuscale.json"


@cache
def render(path: str) -> tuple[dict[str, Any], ...]:
    """``kubectl kustomize deploy/<path>``: the objects, in the order rendered."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl not found: ./dev test installs Debian's kubernetes-client")
    out = subprocess.run([kubectl, "kustomize", str(DEPLOY / path)], capture_output=True,
                         text=True, check=True)
    return tuple(d for d in yaml.safe_load_all(out.stdout) if d)


def by_kind(objs: tuple[dict[str, Any], ...], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def named(objs: Iterable[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name)


AGENTS = ("gpuscale-agent", "gpuscale-agent-amd")  # the NVIDIA and the AMD DaemonSets


# What metricsApi.caBundle holds: a CA certificate, PEM, base64 (only its form matters here).
CA_BUNDLE = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
                             ).decode()


def helm_render(values: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The Helm chart rendered as an install into namespace gpuscale with ``values``."""
    from helm_python.chart import Chart

    chart = Chart.load(DEPLOY / "helm" / "gpuscale")
    out = chart.render(values, name="gpuscale", namespace="gpuscale", is_install=True)
    return [d for text in out.values() for d in yaml.safe_load_all(text) if d]


def key(o: dict[str, Any]) -> tuple[str, str]:
    """An object's (kind, name), to sort renderings by and find objects in them."""
    return o["kind"], o["metadata"]["name"]


def container_args(objs: Iterable[dict[str, Any]]) -> list[str]:
    """Every argument of every container of the DaemonSets and Deployments."""
    return [a for o in objs if o["kind"] in ("DaemonSet", "Deployment")
            for c in o["spec"]["template"]["spec"]["containers"] for a in c["args"]]


def rbac_rules(obj: dict[str, Any]) -> set[tuple[str, str, frozenset[str]]]:
    """A Role's or ClusterRole's grants as (API group, resource, verbs)."""
    return {(group, resource, frozenset(rule["verbs"]))
            for rule in obj["rules"] for group in rule["apiGroups"]
            for resource in rule["resources"]}
