"""The checks on list pages and watch lines: a table of what the contract allows and what
it does not, and hypothesis for everything else (any JSON, any bytes: a value or BadReply,
never another exception)."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuscale.kube.errors import BadReply
from gpuscale.kube.replies import (
    ListPage,
    Status,
    WatchEvent,
    parse_list_page,
    parse_status,
    parse_watch_line,
)
from tests.support.strategies import json_values

POD = {"metadata": {"uid": "u1", "name": "p", "resourceVersion": "7"}}


def page(items: Any = None, **meta: Any) -> dict[str, Any]:
    return {"kind": "PodList", "metadata": {"resourceVersion": "9", **meta},
            "items": [POD] if items is None else items}


def test_a_page_with_its_token() -> None:
    got = parse_list_page(page(**{"continue": "tok", "remainingItemCount": 3}))
    assert got == ListPage((("u1", POD),), "9", "tok")
    assert parse_list_page(page([])).continue_token == ""
    assert parse_list_page({"metadata": {"resourceVersion": "9"}, "items": None}).items == ()


@pytest.mark.parametrize(("body", "why"), [
    ([], "not a JSON object but list"),
    ("PodList", "not a JSON object but str"),
    ({"items": []}, "no metadata object"),
    ({"metadata": [], "items": []}, "no metadata object"),
    (page(resourceVersion=""), "no metadata.resourceVersion"),
    (page(resourceVersion=9), "no metadata.resourceVersion"),
    (page(**{"continue": 5}), "metadata.continue is not a string"),
    ({"metadata": {"resourceVersion": "9"}}, "has no items"),
    (page({"a": POD}), "items are not a list but dict"),
    (page([POD, 1]), "list item 1 is not an object but int"),
    (page([POD, [POD]]), "list item 1 is not an object but list"),
    (page([{"metadata": {"name": "p"}}]), "list item 0 has no metadata.uid"),
    (page([{"metadata": {"uid": ""}}]), "list item 0 has no metadata.uid"),
    (page([{"metadata": {"uid": 12}}]), "list item 0 has no metadata.uid"),
    (page([{"metadata": "u1"}]), "list item 0 has no metadata.uid"),
    (page([{}]), "list item 0 has no metadata.uid"),
])
def test_lists_the_contract_does_not_allow(body: Any, why: str) -> None:
    with pytest.raises(BadReply, match=why):
        parse_list_page(body)


def line(event: Any) -> bytes:
    return json.dumps(event).encode()


def test_events_bookmarks_and_errors() -> None:
    assert parse_watch_line(line({"type": "ADDED", "object": POD})) == \
        WatchEvent("ADDED", "u1", POD, "7")
    assert parse_watch_line(line({"type": "DELETED", "object": {"metadata": {"uid": "u"}}})) \
        == WatchEvent("DELETED", "u", {"metadata": {"uid": "u"}}, "")
    bookmark = {"kind": "Pod", "metadata": {"resourceVersion": "12"}}
    assert parse_watch_line(line({"type": "BOOKMARK", "object": bookmark})) == \
        WatchEvent("BOOKMARK", "", bookmark, "12")
    expired = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}
    assert parse_watch_line(line({"type": "ERROR", "object": expired})) == \
        Status(410, "Expired", "too old")


@pytest.mark.parametrize(("raw", "why"), [
    (b"{not json", "not JSON"),
    (b"\xff\xfe{}", "not JSON"),
    (b"[" * 100_000, "not JSON"),  # nested past the decoder's recursion limit
    (b"5", "not an event"),
    (b'"ADDED"', "not an event"),
    (b"[]", "not an event"),
    (line({"object": POD}), "no known type"),
    (line({"type": 1, "object": POD}), "no known type"),
    (line({"type": ["ADDED"], "object": POD}), "no known type"),
    (line({"type": "SYNC", "object": POD}), "no known type"),
    (line({"type": "ADDED"}), "ADDED event has no object"),
    (line({"type": "ADDED", "object": [POD]}), "ADDED event has no object"),
    (line({"type": "MODIFIED", "object": {"metadata": {}}}), "no metadata.uid"),
    (line({"type": "DELETED", "object": {"metadata": None}}), "no metadata.uid"),
    (line({"type": "BOOKMARK", "object": {"metadata": {}}}), "BOOKMARK without"),
    (line({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": 5}}}),
     "BOOKMARK without"),
    (line({"type": "ERROR", "object": {"message": "boom"}}), "ERROR event without a Status"),
    (line({"type": "ERROR", "object": {"code": True}}), "ERROR event without a Status"),
    (line({"type": "ERROR", "object": {"code": "500"}}), "ERROR event without a Status"),
])
def test_watch_lines_that_are_not_events(raw: bytes, why: str) -> None:
    with pytest.raises(BadReply, match=why):
        parse_watch_line(raw)


def test_status_fields_of_the_wrong_type_are_left_out() -> None:
    assert parse_status({"code": 500, "reason": 3, "message": ["x"]}) == Status(500, "", "")
    assert parse_status({"code": 500, "message": "m" * 2000}) == Status(500, "", "m" * 500)
    assert parse_status([500]) is None


JSON = json_values(["type", "object", "metadata", "uid", "items", "resourceVersion",
                    "continue", "code", "message"])


@given(JSON)
def test_any_json_is_a_page_or_bad_reply(data: Any) -> None:
    try:
        got = parse_list_page(data)
    except BadReply:
        return
    assert got.resource_version
    assert all(uid and isinstance(obj, dict) for uid, obj in got.items)


@given(JSON)
def test_any_json_line_is_an_event_or_bad_reply(data: Any) -> None:
    try:
        got = parse_watch_line(json.dumps(data).encode())
    except BadReply:
        return
    if isinstance(got, WatchEvent):
        assert got.type in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK")
        assert got.uid or got.type == "BOOKMARK"
        assert got.resource_version or got.type != "BOOKMARK"


@given(st.binary(max_size=64))
def test_any_bytes_are_an_event_or_bad_reply(raw: bytes) -> None:
    with contextlib.suppress(BadReply):
        parse_watch_line(raw)
