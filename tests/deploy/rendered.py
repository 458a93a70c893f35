"""The manifests in deploy/ as the tests read them: kustomize renderings (``render``), the
Helm chart's (``helm_render``), and what the tests look for in them."""

from __future__ import annotations

import base64
import json
import os
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


#: Every kustomization in deploy/, as render() takes them (test_kustomize: no other).
KUSTOMIZATIONS = ("kustomize/base", "kustomize/overlays/host-pid", "kustomize/overlays/tls",
                  "kustomize/overlays/production", "kustomize/overlays/metrics-api")
#: The oldest kubectl whose kustomize (v5.0) takes what deploy/ writes and warns on nothing.
MIN_KUBECTL = (1, 27)


@cache
def kubectl() -> str:
    """The kubectl that renders: $GPUSCALE_KUBECTL (./dev test: the cluster toolchain's,
    ``cluster/build kubectl``), else that toolchain's when it is built, else the one on PATH;
    the test fails, saying how to get one, when none is there or it is older than
    MIN_KUBECTL (Debian's kubernetes-client is 1.20, kustomize v2)."""
    cache_dir = Path(os.environ.get("GPUSCALE_CLUSTER_CACHE") or
                     Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                     / "gpuscale" / "cluster")
    built = cache_dir / "bin" / "kubectl"
    found = os.environ.get("GPUSCALE_KUBECTL") or (str(built) if os.access(built, os.X_OK)
                                                    else shutil.which("kubectl"))
    get = f"build one with cluster/build kubectl, or install kubectl {MIN_KUBECTL[0]}." \
          f"{MIN_KUBECTL[1]} or later"
    if found is None:
        pytest.fail(f"kubectl not found: {get}")
    out = subprocess.run([found, "version", "--client", "-o", "json"], capture_output=True,
                         text=True, check=False).stdout
    try:
        v = json.loads(out)["clientVersion"]
        version = (int(v["major"]), int(v["minor"].rstrip("+")))
    except (ValueError, KeyError, TypeError):
        pytest.fail(f"{found}: no version from `kubectl version --client -o json`: {get}")
    if version < MIN_KUBECTL:
        pytest.fail(f"{found} is kubectl {version[0]}.{version[1]}: its kustomize does not "
                    f"take deploy/'s resources and patches; {get}")
    return found


@cache
def kustomize(path: str) -> tuple[str, str]:
    """``kubectl kustomize deploy/<path>``: (the rendering, what kubectl said on stderr)."""
    out = subprocess.run([kubectl(), "kustomize", str(DEPLOY / path)], capture_output=True,
                         text=True, check=False)
    if out.returncode != 0:
        pytest.fail(f"kubectl kustomize deploy/{path}: {out.stderr[-2000:]}")
    return out.stdout, out.stderr


@cache
def render(path: str) -> tuple[dict[str, Any], ...]:
    """``kubectl kustomize deploy/<path>``: the objects, in the order rendered."""
    return tuple(d for d in yaml.safe_load_all(kustomize(path)[0]) if d)


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
