"""The JSON documents of custom.metrics.k8s.io, in each version's exact shape (pure).

v1beta2 ``MetricValue``: ``describedObject``, ``metric: {name, selector}``, ``timestamp``,
``windowSeconds`` (when known), ``value``. v1beta1: ``metricName`` and ``selector`` at the
item's top level, and the window under ``window``. Values are Quantity strings rounded up
(``quantity``); timestamps RFC 3339 in UTC, to the second, as metav1.Time writes them.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpuscale.metrics_api.paths import GROUP, VERSIONS
from gpuscale.metrics_api.quantity import quantity
from gpuscale.metrics_api.served_metrics import OBJECT_METRICS, OBJECT_RESOURCES, POD_METRICS


@dataclass(frozen=True, slots=True)
class Item:
    """One MetricValue before it is written in a version's shape."""

    kind: str
    api_version: str  # of the described object, as the HPA's client expects it ("/v1")
    namespace: str
    name: str
    metric: str
    value: float
    timestamp: float  # wall-clock seconds
    window_s: int | None
    metric_selector: str


REASONS = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound",
           405: "MethodNotAllowed", 429: "TooManyRequests", 500: "InternalError",
           502: "ServiceUnavailable", 503: "ServiceUnavailable"}


def status(code: int, message: str) -> dict[str, Any]:
    """A Kubernetes ``Status`` for an error answer."""
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": REASONS.get(code, "InternalError"), "code": code}


def rfc3339(wall: float) -> str:
    return datetime.datetime.fromtimestamp(int(wall), datetime.UTC).strftime(
        "%Y-%m-%dT%H:%M:%SZ")


def _selector(text: str) -> dict[str, Any] | None:
    """The metric selector as a LabelSelector (equality requirements, as the planner's
    settings are given), or null when there is none."""
    if not text.strip():
        return None
    pairs = [part.split("=", 1) for part in text.split(",") if "=" in part]
    return {"matchLabels": {k.strip(): v.strip() for k, v in pairs}}


def metric_value(version: str, item: Item) -> dict[str, Any]:
    described = {"kind": item.kind, "namespace": item.namespace, "name": item.name,
                 "apiVersion": item.api_version}
    out: dict[str, Any] = {"describedObject": described}
    if version == "v1beta1":
        out["metricName"] = item.metric
    else:
        out["metric"] = {"name": item.metric, "selector": _selector(item.metric_selector)}
    out["timestamp"] = rfc3339(item.timestamp)
    if item.window_s is not None:
        out["window" if version == "v1beta1" else "windowSeconds"] = item.window_s
    out["value"] = quantity(item.value)
    if version == "v1beta1":
        out["selector"] = _selector(item.metric_selector)
    return out


def value_list(version: str, items: Iterable[Item]) -> dict[str, Any]:
    return {"kind": "MetricValueList", "apiVersion": f"{GROUP}/{version}", "metadata": {},
            "items": [metric_value(version, i) for i in items]}


def _versions() -> list[dict[str, str]]:
    return [{"groupVersion": f"{GROUP}/{v}", "version": v} for v in VERSIONS]


def api_group() -> dict[str, Any]:
    return {"name": GROUP, "versions": _versions(), "preferredVersion": _versions()[0]}


def group_list() -> dict[str, Any]:
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [api_group()]}


def group_document() -> dict[str, Any]:
    return {"kind": "APIGroup", "apiVersion": "v1", **api_group()}


def resource_list(version: str) -> dict[str, Any]:
    """Every metric, as ``resource/metric`` entries (custom-metrics-apiserver's form)."""
    names = [f"pods/{m}" for m in sorted(POD_METRICS)] + \
        [f"{r}/{m}" for r in sorted(OBJECT_RESOURCES) for m in sorted(OBJECT_METRICS)]
    return {"kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": f"{GROUP}/{version}",
            "resources": [{"name": n, "singularName": "", "namespaced": True,
                           "kind": "MetricValueList", "verbs": ["get"]} for n in names]}
