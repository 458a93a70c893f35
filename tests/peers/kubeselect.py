"""Label and field selectors as the API server parses and matches them, for the API-server
peer. Written from apimachinery, not from gpuscale's own selector (scaler/selector.py), so a
bug there cannot hide here:

- labels: ``k8s.io/apimachinery/pkg/labels/selector.go`` - its lexer (special symbols
  ``= ! ( ) , > <``, keywords ``in``/``notin`` that are plain values inside a value list), its
  parser (``k``, ``!k``, ``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``, ``k notin (a,b)``,
  ``k>1``, ``k<1``; ``k=`` and ``k in ()`` mean the empty value) and ``Requirement.Matches``
  (``!=`` and ``notin`` also match objects without the label).
- fields: ``k8s.io/apimachinery/pkg/fields/selector.go`` - terms split on unescaped commas,
  the first ``!=``/``==``/``=`` splits a term, values unescaped (``\\``, ``\\,``, ``\\=``;
  any other escape or a bare ``,``/``=`` in a value is an error); and the fields each
  resource can be selected on (``pkg/registry/core/pod/strategy.go`` ``ToSelectableFields``
  for pods, ``metadata.name``/``metadata.namespace`` for everything): anything else is
  ``field label not supported``.

A selector the server would refuse raises ``SelectorError`` (answered 400 BadRequest).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

SPECIAL = "=!(),><"
WHITESPACE = " \t\r\n"
_TOKENS = {")": "close", ",": "comma", "!": "not", "==": "eq2", "=": "eq", ">": "gt",
           "in": "in", "<": "lt", "!=": "ne", "notin": "notin", "(": "open"}
_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_INT64 = re.compile(r"[+-]?[0-9]+")


class SelectorError(ValueError):
    """The API server would answer 400 BadRequest with this message."""


# -- labels ----------------------------------------------------------------------------


def _lex(text: str) -> list[tuple[str, str]]:
    """(token, literal) pairs ending with ("end", ""): the Lexer of labels/selector.go."""
    out: list[tuple[str, str]] = []
    i = 0
    while True:
        while i < len(text) and text[i] in WHITESPACE:
            i += 1
        if i == len(text):
            out.append(("end", ""))
            return out
        if text[i] in SPECIAL:  # longest run of special symbols that is still a token
            buf, last = "", ("", "")
            while i < len(text) and text[i] in SPECIAL:
                buf += text[i]
                if buf in _TOKENS:
                    last = (_TOKENS[buf], buf)
                    i += 1
                elif last[0]:
                    break
                else:
                    i += 1
            if not last[0]:
                out.append(("error", f"error expected: keyword found '{buf}'"))
            else:
                out.append(last)
            continue
        start = i
        while i < len(text) and text[i] not in SPECIAL and text[i] not in WHITESPACE:
            i += 1
        word = text[start:i]
        out.append((_TOKENS[word], word) if word in ("in", "notin") else ("id", word))


def _valid_key(key: str) -> str:
    """``content.IsLabelKey``: [prefix/]name, prefix a DNS-1123 subdomain <= 253, name
    <= 63 characters of [-A-Za-z0-9_.] starting and ending alphanumeric."""
    prefix, _, name = key.rpartition("/")
    if "/" in key and (not prefix or len(prefix) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(prefix)):
        raise SelectorError(f"invalid label key {key!r}: prefix part must be a DNS-1123 "
                            f"subdomain")
    if not name or len(name) > 63 or not _NAME.fullmatch(name):
        raise SelectorError(f"invalid label key {key!r}: name part must consist of "
                            f"alphanumeric characters, '-', '_' or '.'")
    return key


def _valid_value(value: str) -> str:
    """``validation.IsValidLabelValue``: empty, or <= 63 of [-A-Za-z0-9_.] starting and
    ending alphanumeric."""
    if value and (len(value) > 63 or not _NAME.fullmatch(value)):
        raise SelectorError(f"invalid label value {value!r}: a valid label must be an empty "
                            f"string or consist of alphanumeric characters, '-', '_' or '.'")
    return value


@dataclass(frozen=True)
class LabelRequirement:
    key: str
    op: str  # "exists", "!exists", "=", "==", "!=", "in", "notin", ">", "<"
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key, "")
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op in ("=", "==", "in"):
            return present and value in self.values
        if self.op in ("!=", "notin"):
            return not present or value not in self.values
        if not present or not _INT64.fullmatch(value):  # ">" / "<": integers only
            return False
        bound = int(next(iter(self.values)))
        return int(value) > bound if self.op == ">" else int(value) < bound


def parse_labels(text: str) -> tuple[LabelRequirement, ...]:
    """The requirements of a label selector (all must match); SelectorError if invalid."""
    return _LabelParser(_lex(text)).parse()


class _LabelParser:
    """apimachinery's labels.Parser: a recursive descent over the lexer's tokens."""

    def __init__(self, toks: list[tuple[str, str]]) -> None:
        self.toks = toks
        self.pos = 0

    def peek(self, values: bool = True) -> tuple[str, str]:
        tok, lit = self.toks[self.pos]
        return ("id", lit) if values and tok in ("in", "notin") else (tok, lit)

    def take(self, values: bool = True) -> tuple[str, str]:
        got = self.peek(values)
        self.pos += 1
        return got

    def requirement(self) -> LabelRequirement:
        op = ""
        tok, lit = self.take()
        if tok == "not":
            op = "!exists"
            tok, lit = self.take()
        if tok != "id":
            raise SelectorError(f"found '{lit}', expected: identifier")
        key = _valid_key(lit)
        if op or self.peek()[0] in ("end", "comma"):  # "!k" takes nothing more, whatever follows
            return LabelRequirement(key, op or "exists")
        tok, lit = self.take(values=False)
        ops = {"in": "in", "notin": "notin", "eq": "=", "eq2": "==", "ne": "!=", "gt": ">",
               "lt": "<"}
        if tok not in ops:
            raise SelectorError(f"found '{lit}', expected: in, notin, =, ==, !=, gt, lt")
        op = ops[tok]
        if op in ("in", "notin"):
            values = self.value_set()
        else:
            values = self.exact_value()
            if op in (">", "<") and not _INT64.fullmatch(next(iter(values))):
                raise SelectorError("for 'Gt', 'Lt' operators, the value must be an integer")
        for v in values:
            _valid_value(v)
        return LabelRequirement(key, op, frozenset(values))

    def value_set(self) -> set[str]:
        tok, lit = self.take()
        if tok != "open":
            raise SelectorError(f"found '{lit}' expected: '('")
        tok, lit = self.peek()
        if tok == "close":  # "()" is the empty value
            self.take()
            return {""}
        if tok not in ("id", "comma"):
            raise SelectorError(f"found '{lit}', expected: ',', ')' or identifier")
        out: set[str] = set()
        while True:
            tok, lit = self.take()
            if tok == "id":
                out.add(lit)
                nxt, nlit = self.peek()
                if nxt == "comma":
                    continue
                if nxt == "close":
                    self.take()
                    return out
                raise SelectorError(f"found '{nlit}', expected: ',' or ')'")
            if tok == "comma":  # "(,", ",,", ",)" each add the empty value
                if not out:
                    out.add("")
                nxt, _ = self.peek()
                if nxt == "close":
                    out.add("")
                    self.take()
                    return out
                if nxt == "comma":
                    out.add("")
                continue
            raise SelectorError(f"found '{lit}', expected: ',', or identifier")

    def exact_value(self) -> set[str]:
        tok, lit = self.peek()
        if tok in ("end", "comma"):
            return {""}
        tok, lit = self.take()
        if tok != "id":
            raise SelectorError(f"found '{lit}', expected: identifier")
        return {lit}

    def parse(self) -> tuple[LabelRequirement, ...]:
        reqs: list[LabelRequirement] = []
        while True:
            tok, lit = self.peek()
            if tok == "end":
                return tuple(reqs)
            if tok not in ("id", "not"):
                raise SelectorError(f"found '{lit}', expected: !, identifier, or 'end of string'")
            try:
                reqs.append(self.requirement())
            except SelectorError as exc:
                raise SelectorError(f"unable to parse requirement: {exc}") from None
            tok, lit = self.take()
            if tok == "end":
                return tuple(reqs)
            if tok != "comma":
                raise SelectorError(f"found '{lit}', expected: ',' or 'end of string'")
            if self.peek()[0] not in ("id", "not"):
                raise SelectorError(f"found '{self.peek()[1]}', expected: identifier after ','")


# -- fields ----------------------------------------------------------------------------
def _split_terms(text: str) -> list[str]:
    """Split on commas not escaped by a backslash (the escapes stay in the terms)."""
    terms, start, i = [], 0, 0
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == ",":
            terms.append(text[start:i])
            start = i + 1
        i += 1
    terms.append(text[start:])
    return terms


def _unescape(value: str) -> str:
    out, i = [], 0
    while i < len(value):
        c = value[i]
        if c == "\\":
            if i + 1 == len(value) or value[i + 1] not in "\\,=":
                raise SelectorError(f"invalid field selector: invalid escape sequence: "
                                    f"{value[i:i + 2]}")
            out.append(value[i + 1])
            i += 2
            continue
        if c in ",=":
            raise SelectorError(f"invalid field selector: unescaped character in value: {c}")
        out.append(c)
        i += 1
    return "".join(out)


@dataclass(frozen=True)
class FieldRequirement:
    field: str
    op: str  # "=" or "!="
    value: str


def parse_fields(text: str, supported: Mapping[str, Callable[[Mapping[str, Any]], str]],
                 ) -> tuple[FieldRequirement, ...]:
    """The terms of a field selector for a resource whose selectable fields are
    ``supported``; SelectorError if invalid or a field is not selectable."""
    reqs = []
    for term in _split_terms(text):
        if not term:
            continue
        for i in range(len(term)):  # the first operator splits: no escapes on the left
            op = next((o for o in ("!=", "==", "=") if term.startswith(o, i)), "")
            if op:
                break
        else:
            raise SelectorError(f"invalid selector: '{text}'; can't understand '{term}'")
        field, value = term[:i], _unescape(term[i + len(op):])
        if field not in supported:
            raise SelectorError(f"field label not supported: {field}")
        reqs.append(FieldRequirement(field, "!=" if op == "!=" else "=", value))
    return tuple(reqs)


def _path(*keys: str) -> Callable[[Mapping[str, Any]], str]:
    def get(obj: Mapping[str, Any]) -> str:
        cur: Any = obj
        for k in keys:
            cur = cur.get(k) if isinstance(cur, Mapping) else None
        return "" if cur is None else str(cur)
    return get


GENERIC_FIELDS = {"metadata.name": _path("metadata", "name"),
                  "metadata.namespace": _path("metadata", "namespace")}
POD_FIELDS = {**GENERIC_FIELDS,
              "spec.nodeName": _path("spec", "nodeName"),
              "spec.restartPolicy": _path("spec", "restartPolicy"),
              "spec.schedulerName": _path("spec", "schedulerName"),
              "spec.serviceAccountName": _path("spec", "serviceAccountName"),
              "status.phase": _path("status", "phase"),
              "status.podIP": _path("status", "podIP"),
              "status.nominatedNodeName": _path("status", "nominatedNodeName")}
# pkg/apis/resource/types.go ResourceSliceSelector*: what a ResourceSlice list selects on
SLICE_FIELDS = {**GENERIC_FIELDS,
                "spec.nodeName": _path("spec", "nodeName"),
                "spec.driver": _path("spec", "driver"),
                "spec.pool.name": _path("spec", "pool", "name")}


@dataclass(frozen=True)
class Selection:
    """A request's label and field selectors, parsed once."""

    labels: tuple[LabelRequirement, ...]
    fields: tuple[FieldRequirement, ...]
    getters: Mapping[str, Callable[[Mapping[str, Any]], str]]

    @property
    def empty(self) -> bool:
        return not self.labels and not self.fields

    def matches(self, obj: Mapping[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        labels = meta.get("labels") or {}
        if not all(r.matches(labels) for r in self.labels):
            return False
        return all((self.getters[f.field](obj) == f.value) == (f.op == "=")
                   for f in self.fields)


def selection(label_selector: str, field_selector: str,
              fields: Mapping[str, Callable[[Mapping[str, Any]], str]]) -> Selection:
    return Selection(parse_labels(label_selector), parse_fields(field_selector, fields),
                     fields)
