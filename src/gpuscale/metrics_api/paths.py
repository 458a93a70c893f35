"""Request paths of custom.metrics.k8s.io, parsed strictly (pure).

Served forms (as kubernetes/metrics' versioned client builds them):
``/apis``, ``/apis/custom.metrics.k8s.io``, ``/apis/custom.metrics.k8s.io/{version}``,
``.../{version}/namespaces/{ns}/pods/{name or *}/{metric}`` and
``.../{version}/namespaces/{ns}/{resource}.{group}/{name}/{metric}``. Each segment is
percent-decoded once and must be a valid object name (no ``/``, ``.``, ``..``, ``%``), so
nothing in a path can point elsewhere. Root-scoped objects and namespace metrics are
parsed, then answered 404 by the served metrics.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote

from gpuscale.common.errors import ConfigError

GROUP = "custom.metrics.k8s.io"
VERSIONS = ("v1beta2", "v1beta1")  # preferred first
MAX_PATH = 2048
MAX_SEGMENT = 253
_METRIC = re.compile(r"[A-Za-z_:][A-Za-z0-9_:.\-]*")
_RESOURCE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


class BadPath(ConfigError):
    """A path that cannot name anything here (400), or names nothing (``missing``: 404)."""

    def __init__(self, message: str, missing: bool = False) -> None:
        super().__init__(message)
        self.http_status = 404 if missing else 400


@dataclass(frozen=True, slots=True)
class Discovery:
    level: str  # "apis", "group" or "version"
    version: str = ""


@dataclass(frozen=True, slots=True)
class MetricPath:
    version: str
    namespace: str  # "" for a root-scoped object
    resource: str  # "pods", "deployments.apps", ...
    name: str  # "*" for every object the label selector picks
    metric: str


def _segment(raw: str, what: str) -> str:
    try:
        text = unquote(raw, errors="strict")
    except UnicodeDecodeError:
        raise BadPath(f"{what}: not UTF-8 once percent-decoded") from None
    if not text or len(text) > MAX_SEGMENT:
        raise BadPath(f"{what}: must be 1 to {MAX_SEGMENT} characters")
    if text in (".", "..") or "/" in text or "%" in text:
        raise BadPath(f"{what}: {text[:64]!r} cannot be a name")
    return text


def parse_path(raw_path: str) -> Discovery | MetricPath:
    """The request a raw (still percent-encoded) path names, without its query."""
    if len(raw_path) > MAX_PATH:
        raise BadPath(f"the path is longer than {MAX_PATH} characters")
    parts = raw_path.rstrip("/").split("/")[1:] if raw_path != "/" else []
    if parts == ["apis"]:
        return Discovery("apis")
    if len(parts) < 2 or parts[0] != "apis" or parts[1] != GROUP:
        raise BadPath(f"{raw_path[:100]} is not served here (only /apis/{GROUP})", True)
    if len(parts) == 2:
        return Discovery("group")
    version = parts[2]
    if version not in VERSIONS:
        raise BadPath(f"version {version[:20]!r} is not served ({', '.join(VERSIONS)})", True)
    rest = parts[3:]
    if not rest:
        return Discovery("version", version)
    namespace = ""
    if rest[0] == "namespaces" and len(rest) >= 3:
        namespace = _segment(rest[1], "namespace")
        rest = rest[2:]
        if len(rest) == 2 and rest[0] == "metrics":  # the namespace object's own metric
            return MetricPath(version, "", "namespaces", namespace, _metric(rest[1]))
    if len(rest) != 3:
        raise BadPath(f"{raw_path[:100]}: expected .../namespaces/NS/RESOURCE/NAME/METRIC",
                      True)
    resource = _segment(rest[0], "resource")
    if not _RESOURCE.fullmatch(resource):
        raise BadPath(f"resource: {resource[:64]!r} is not a resource name")
    name = rest[1] if rest[1] == "*" else _segment(rest[1], "name")
    return MetricPath(version, namespace, resource, name, _metric(rest[2]))


def _metric(raw: str) -> str:
    text = _segment(raw, "metric")
    if not _METRIC.fullmatch(text):
        raise BadPath(f"metric: {text[:64]!r} is not a metric name")
    return text
