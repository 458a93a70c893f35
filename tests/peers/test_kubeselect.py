"""The API-server peer's selectors against apimachinery's grammar and semantics (tables from
its documented examples, hypothesis for the rest), and gpuscale's own label-selector parser
against the peer's: wherever gpuscale accepts a selector, the API server accepts it too and
selects the same pods."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from gpuscale.scaler.core.selector import SelectorError as OurSelectorError
from gpuscale.scaler.core.selector import parse_selector
from tests.peers.kubeselect import (
    GENERIC_FIELDS,
    POD_FIELDS,
    FieldRequirement,
    LabelRequirement,
    SelectorError,
    parse_fields,
    parse_labels,
    selection,
)


def req(key: str, op: str, *values: str) -> LabelRequirement:
    return LabelRequirement(key, op, frozenset(values))


@pytest.mark.parametrize(("text", "want"), [
    ("", ()),
    ("x=a", (req("x", "=", "a"),)),
    (" x == a , y != b ", (req("x", "==", "a"), req("y", "!=", "b"))),
    ("x in (a,b),y notin ( c )", (req("x", "in", "a", "b"), req("y", "notin", "c"))),
    ("x,!y", (req("x", "exists"), req("y", "!exists"))),
    ("x=,y!=", (req("x", "=", ""), req("y", "!=", ""))),
    ("x in (foo,,baz),y,z notin ()", (req("x", "in", "foo", "", "baz"), req("y", "exists"),
                                      req("z", "notin", ""))),
    ("x in (in,notin)", (req("x", "in", "in", "notin"),)),  # keywords are values in a set
    ("in", (req("in", "exists"),)),  # ... and a key at the start
    ("x>1,y<-1x", None),  # values must be label values too: "-1x" is not one
    ("x>1,y<10", (req("x", ">", "1"), req("y", "<", "10"))),
    ("example.com/app=a", (req("example.com/app", "=", "a"),)),
])
def test_label_selectors_apimachinery_parses(text: str,
                                             want: tuple[LabelRequirement, ...] | None) -> None:
    if want is None:
        with pytest.raises(SelectorError):
            parse_labels(text)
    else:
        assert parse_labels(text) == want


@pytest.mark.parametrize("text", [
    "x=a||y=b", "x==a==b", "!x=a", "x in (a", "x in a", "x>a", "=a", ",x", "x,", "x=a,",
    "x=a b", "x=@", "-x=a", "x=" + "a" * 64, "x in (a b)", "Example.com/x=a", "/x", "x!",
])
def test_label_selectors_apimachinery_refuses(text: str) -> None:
    with pytest.raises(SelectorError):
        parse_labels(text)


@pytest.mark.parametrize(("text", "labels", "match"), [
    ("x!=a", {}, True),  # != and notin also select objects without the label
    ("x notin (a)", {}, True),
    ("x in (a)", {}, False),
    ("x=", {"x": ""}, True),
    ("x=", {}, False),
    ("!x", {"x": ""}, False),
    ("x>5", {"x": "10"}, True),
    ("x>5", {"x": "ten"}, False),
    ("x<5", {}, False),
    ("x,y=b", {"x": "a", "y": "b"}, True),
    ("x,y=b", {"y": "b"}, False),
])
def test_label_matching(text: str, labels: dict[str, str], match: bool) -> None:
    assert all(r.matches(labels) for r in parse_labels(text)) is match


@pytest.mark.parametrize(("text", "want"), [
    ("spec.nodeName=n1,status.phase!=Failed",
     (FieldRequirement("spec.nodeName", "=", "n1"),
      FieldRequirement("status.phase", "!=", "Failed"))),
    (",metadata.name==a\\,b\\=c\\\\,", (FieldRequirement("metadata.name", "=", "a,b=c\\"),)),
    ("spec.nodeName=", (FieldRequirement("spec.nodeName", "=", ""),)),
])
def test_field_selectors(text: str, want: tuple[FieldRequirement, ...]) -> None:
    assert parse_fields(text, POD_FIELDS) == want


@pytest.mark.parametrize(("text", "why"), [
    ("metadata.name=a,b", "can't understand 'b'"),
    ("metadata.name=a=b", "unescaped character"),
    ("metadata.name=a\\b", "invalid escape sequence"),
    ("metadata.name=a\\", "invalid escape sequence"),
    ("spec.nodeName", "can't understand"),
    ("spec.hostname=a", "field label not supported: spec.hostname"),
])
def test_field_selectors_the_server_refuses(text: str, why: str) -> None:
    with pytest.raises(SelectorError, match=why):
        parse_fields(text, POD_FIELDS)
    with pytest.raises(SelectorError):  # deployments have only the metadata fields
        parse_fields("spec.nodeName=a", GENERIC_FIELDS)


def test_a_selection_on_a_pod() -> None:
    pod = {"metadata": {"name": "p", "namespace": "llm", "labels": {"app": "a"}},
           "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}}
    assert selection("app=a", "spec.nodeName=n1,status.phase!=Succeeded", POD_FIELDS
                     ).matches(pod)
    assert not selection("app=a", "metadata.namespace!=llm", POD_FIELDS).matches(pod)
    assert selection("", "", POD_FIELDS).empty


@given(st.text(alphabet="xyz.-_/=!(),<> \tinotu0123", max_size=40))
def test_any_text_is_a_label_selector_or_refused(text: str) -> None:
    with contextlib.suppress(SelectorError):
        parse_labels(text)


@given(st.text(alphabet="ab.=!,\\ ", max_size=30))
def test_any_text_is_a_field_selector_or_refused(text: str) -> None:
    with contextlib.suppress(SelectorError):
        parse_fields(text, {"a": lambda o: "", "b.a": lambda o: ""})


KEYS = st.sampled_from(["app", "tier", "example.com/team", "x"])
VALUES = st.sampled_from(["", "a", "b", "gpu", "in", "v1.2"])
OPS = st.sampled_from(["=", "==", "!=", "in", "notin", "exists", "!exists"])


@st.composite
def requirements(draw: st.DrawFn) -> tuple[str, LabelRequirement]:
    key, op = draw(KEYS), draw(OPS)
    pad = draw(st.sampled_from(["", " ", "  "]))
    if op in ("exists", "!exists"):
        return f"{'!' if op == '!exists' else ''}{pad}{key}", req(key, op)
    if op in ("in", "notin"):
        values = draw(st.lists(VALUES.filter(bool), min_size=1, max_size=3))
        return f"{key} {op}{pad}({pad}{','.join(values)}{pad})", req(key, op, *values)
    value = draw(VALUES)
    return f"{key}{pad}{op}{pad}{value}", req(key, op, value)


LABELS = st.dictionaries(KEYS, VALUES, max_size=4)


@given(st.lists(requirements(), min_size=1, max_size=4), LABELS)
def test_rendered_selectors_parse_back(reqs: list[tuple[str, LabelRequirement]],
                                       labels: dict[str, str]) -> None:
    got = parse_labels(",".join(text for text, _ in reqs))
    assert got == tuple(r for _, r in reqs)


@given(st.lists(requirements(), min_size=1, max_size=4), LABELS)
def test_gpuscale_selects_what_the_api_server_selects(
        reqs: list[tuple[str, LabelRequirement]], labels: dict[str, str]) -> None:
    text = ",".join(t for t, _ in reqs)
    try:
        ours = parse_selector(text)
    except OurSelectorError:
        ours = None
    assume(ours is not None)  # refusing a selector is safe; selecting other pods is not
    assert ours is not None
    theirs = parse_labels(text)  # refused here: gpuscale accepted what the server would not
    assert ours.matches(labels) == all(r.matches(labels) for r in theirs), text
