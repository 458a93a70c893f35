"""The API server's list pages and watch events, checked before anything reads them.

Pure functions from a decoded body (or one raw watch line) to small values. Whatever the
API's contract does not allow - a list whose items are not objects or have no
``metadata.uid``, a watch line that is not an event, an ERROR event without a Status - is a
``BadReply`` saying what was wrong, never a KeyError or TypeError in whoever reads it next.
The objects themselves are passed on as the server sent them; whoever reads their fields
does so through ``obj_at``/``list_at``/``str_at``, which answer "absent" for a field of
the wrong JSON type instead of raising.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuscale.kube.errors import BadReply

EVENT_TYPES = ("ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR")
_SHOWN = 120  # characters of a bad reply quoted in the error


def _quote(raw: bytes | str) -> str:
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    return repr(text[:_SHOWN]) + ("..." if len(text) > _SHOWN else "")


def load_json(raw: bytes, what: str) -> Any:
    """``raw`` decoded; BadReply when it is not JSON (or nested too deep to decode)."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise BadReply(f"{what} is not JSON: {_quote(raw)}") from None


@dataclass(frozen=True, slots=True)
class Status:
    """A metav1.Status: what the server says went wrong."""

    code: int
    reason: str
    message: str


def parse_status(data: Any) -> Status | None:
    """The Status in ``data``, or None when it is not one (no integer ``code``)."""
    if not isinstance(data, Mapping):
        return None
    code = data.get("code")
    if not isinstance(code, int) or isinstance(code, bool):
        return None
    reason, message = data.get("reason"), data.get("message")
    return Status(code, reason if isinstance(reason, str) else "",
                  message[:500] if isinstance(message, str) else "")


@dataclass(frozen=True, slots=True)
class ListPage:
    """One page of a list: its objects by uid, the snapshot's resourceVersion and the token
    for the next page ("" on the last)."""

    items: tuple[tuple[str, dict[str, Any]], ...]
    resource_version: str
    continue_token: str


def _uid(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    uid = meta.get("uid") if isinstance(meta, Mapping) else None
    return uid if isinstance(uid, str) else ""


def parse_list_page(data: Any) -> ListPage:
    """A list response checked: an object whose ``metadata.resourceVersion`` is a non-empty
    string, ``metadata.continue`` a string if present, and ``items`` a list (``null``: none)
    of objects that each have a non-empty ``metadata.uid``. BadReply otherwise."""
    if not isinstance(data, Mapping):
        raise BadReply(f"the list is not a JSON object but {type(data).__name__}")
    meta = data.get("metadata")
    if not isinstance(meta, Mapping):
        raise BadReply("the list has no metadata object")
    rv, token = meta.get("resourceVersion"), meta.get("continue", "")
    if not isinstance(rv, str) or not rv:
        raise BadReply(f"the list has no metadata.resourceVersion (got {_quote(repr(rv))})")
    if not isinstance(token, str):
        raise BadReply("the list's metadata.continue is not a string")
    if "items" not in data:
        raise BadReply("the list has no items")
    raw = data["items"]
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise BadReply(f"the list's items are not a list but {type(raw).__name__}")
    items = []
    for i, obj in enumerate(raw):
        if not isinstance(obj, dict):
            raise BadReply(f"list item {i} is not an object but {type(obj).__name__}")
        uid = _uid(obj)
        if not uid:
            raise BadReply(f"list item {i} has no metadata.uid")
        items.append((uid, obj))
    return ListPage(tuple(items), rv, token)


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """ADDED, MODIFIED, DELETED (``uid`` set) or BOOKMARK (``uid`` empty, ``obj`` the
    bookmark); ``resource_version`` is the object's, "" when it carries none."""

    type: str
    uid: str
    obj: dict[str, Any]
    resource_version: str


def parse_watch_line(line: bytes) -> WatchEvent | Status:
    """One line of a watch stream: an event, or the Status of an ERROR event. BadReply for
    a line that is not a JSON object with a known ``type`` and an ``object`` object, an
    object event whose object has no ``metadata.uid``, a BOOKMARK without
    ``metadata.resourceVersion`` or an ERROR without a Status."""
    data = load_json(line, "a watch line")
    if not isinstance(data, dict):
        raise BadReply(f"a watch line is not an event: {_quote(line)}")
    kind, obj = data.get("type"), data.get("object")
    if kind not in EVENT_TYPES:
        raise BadReply(f"a watch event has no known type: {_quote(line)}")
    if not isinstance(obj, dict):
        raise BadReply(f"a {kind} event has no object: {_quote(line)}")
    if kind == "ERROR":
        status = parse_status(obj)
        if status is None:
            raise BadReply(f"an ERROR event without a Status: {_quote(line)}")
        return status
    meta = obj.get("metadata")
    rv = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
    rv = rv if isinstance(rv, str) else ""
    if kind == "BOOKMARK":
        if not rv:
            raise BadReply(f"a BOOKMARK without metadata.resourceVersion: {_quote(line)}")
        return WatchEvent(kind, "", obj, rv)
    uid = _uid(obj)
    if not uid:
        raise BadReply(f"a {kind} event whose object has no metadata.uid: {_quote(line)}")
    return WatchEvent(kind, uid, obj, rv)


def _at(data: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(data, Mapping):
            return None
        data = data.get(key)
    return data


def obj_at(data: Any, *path: str) -> Mapping[str, Any]:
    """The JSON object at ``path`` in ``data``; empty when absent or not an object."""
    got = _at(data, path)
    return got if isinstance(got, Mapping) else {}


def list_at(data: Any, *path: str) -> list[Any]:
    """The JSON array at ``path`` in ``data``; empty when absent or not an array."""
    got = _at(data, path)
    return got if isinstance(got, list) else []


def int_at(data: Any, *path: str, default: int) -> int:
    """The integer at ``path`` in ``data`` (not a bool); ``default`` when absent or not an
    integer."""
    got = _at(data, path)
    return got if isinstance(got, int) and not isinstance(got, bool) else default


def str_at(data: Any, *path: str) -> str:
    """The string at ``path`` in ``data``; "" when absent or not a string."""
    got = _at(data, path)
    return got if isinstance(got, str) else ""
