"""Kubeconfig files for the tests of how gpuscale finds and talks to a cluster."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_kubeconfig(path: Path, server: str, user: dict[str, Any] | None,
                     ca: Path | None = None) -> Path:
    """A kubeconfig (JSON is YAML) for one cluster and user: ``user`` as kubeconfig spells
    it (``{"token": ...}``, ``{"client-certificate": ..., "client-key": ...}``, an exec
    plugin...; None: a context without a user), ``ca`` the server's CA file for https."""
    cluster: dict[str, str] = {"server": server}
    if ca is not None:
        cluster["certificate-authority"] = str(ca)
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user}] if user else [],
        "contexts": [{"name": "c", "context": {"cluster": "c",
                                               **({"user": "u"} if user else {})}}]}))
    return path
