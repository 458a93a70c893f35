"""Paginated lists as the real API server pages them (kubernetes/kubernetes,
staging/src/k8s.io/apiserver/pkg/storage/etcd3/store.go ``GetList``), for the test API
server (tests/peers/kubeapi.py): ``limit`` items a page in key order (namespace/name),
``metadata.continue`` while keys remain after the page - so the last page may come back
empty - and ``remainingItemCount`` only when no selector is set. The continue token is
storage.EncodeContinue's; the 410 for a compacted one carries etcd3/errors.go's message."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping
from typing import Any

from tests.peers.kubeselect import Selection

# etcd3/errors.go: the 410 for a continue token whose snapshot was compacted away.
CONTINUE_EXPIRED = (
    "The provided continue parameter is too old to display a consistent list result. You "
    "can start a new list without the continue parameter, or use the continue token in "
    "this response to retrieve the remainder of the results. Continuing with the provided "
    "token results in an inconsistent list - objects that were created, modified, or "
    "deleted between the time the first chunk was returned and now may show up in the list.")


def key(obj: Mapping[str, Any]) -> str:
    """The object's place in the store's key order (etcd: /registry/<resource>/<ns>/<name>)."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name', '')}" if ns else str(meta.get("name", ""))


def encode_continue(rv: int, start: str) -> str:
    """storage.EncodeContinue: base64url (no padding) of the version, snapshot and start."""
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": start}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_continue(token: str) -> tuple[int, str]:
    raw = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    if raw.get("v") != "meta.k8s.io/v1" or not isinstance(raw.get("rv"), int) or \
            raw["rv"] == 0 or not isinstance(raw.get("start"), str):
        raise ValueError(token)
    return raw["rv"], raw["start"]


def list_page(objects: Iterable[dict[str, Any]], sel: Selection, limit: int, start: str,
              snapshot: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One page of ``objects`` (the collection at ``snapshot``) from key ``start``: at most
    ``limit`` selected items (0: all), and the list's metadata."""
    keyed = sorted((k, o) for o in objects if (k := key(o)) >= start)
    page: list[dict[str, Any]] = []
    last, more, remaining = "", False, 0
    for i, (k, obj) in enumerate(keyed):
        if limit and len(page) >= limit:
            more = True
            remaining = len(keyed) - i
            break
        last = k
        if sel.matches(obj):
            page.append(obj)
    meta: dict[str, Any] = {"resourceVersion": str(snapshot)}
    if more:
        meta["continue"] = encode_continue(snapshot, last + "\x00")
        if sel.empty:
            meta["remainingItemCount"] = remaining
    return page, meta
