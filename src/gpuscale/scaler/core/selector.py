"""Kubernetes label selectors in their string form, parsed strictly and matched purely.

Grammar (as ``kubectl -l`` accepts): comma-separated requirements, each one of
``key=value``, ``key==value``, ``key!=value``, ``key in (a,b)``, ``key notin (a,b)``,
``key`` (exists) and ``!key`` (does not exist). Keys and values follow the Kubernetes
syntax rules (optional DNS-subdomain prefix, 63-character names).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from gpuscale.common.errors import ConfigError

MAX_SELECTOR = 4096
_NAME = r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_KEY = re.compile(rf"(?:[a-z0-9](?:[-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_NAME}")
_VALUE = re.compile(rf"(?:{_NAME})?")
_SET = re.compile(r"\s*(?P<key>[^\s!=()]+)\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)\s*")
_CMP = re.compile(r"\s*(?P<key>[^\s!=()]+)\s*(?P<op>==|=|!=)\s*(?P<value>[^\s,()]*)\s*")
_EXISTS = re.compile(r"\s*(?P<neg>!?)\s*(?P<key>[^\s!=(),]+)\s*")


class SelectorError(ConfigError):
    """A selector that is not valid Kubernetes label-selector syntax."""


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!exists"
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op in ("=", "in"):
            return present and labels[self.key] in self.values
        return not present or labels[self.key] not in self.values  # "!=", "notin"


@dataclass(frozen=True, slots=True)
class Selector:
    requirements: tuple[Requirement, ...]
    text: str

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)


def parse_selector(text: str) -> Selector:
    """Parse a selector string; raises SelectorError naming the offending part."""
    if len(text) > MAX_SELECTOR:
        raise SelectorError(f"longer than {MAX_SELECTOR} characters")
    if not text.strip():
        raise SelectorError("empty: it would select every pod in the namespace")
    reqs = []
    for part in _split(text):
        reqs.append(_requirement(part))
    return Selector(tuple(reqs), text)


def _split(text: str) -> list[str]:
    """Split at commas outside parentheses."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise SelectorError("unbalanced ')'")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise SelectorError("unbalanced '('")
    parts.append("".join(cur))
    return parts


def _requirement(part: str) -> Requirement:
    if m := _SET.fullmatch(part):
        values = [v.strip() for v in m["values"].split(",")]
        if any(not v for v in values):
            raise SelectorError(f"{part.strip()[:80]!r}: empty value in the set")
        return Requirement(_key(m["key"]), m["op"], frozenset(_value(v) for v in values))
    if m := _CMP.fullmatch(part):
        op = "!=" if m["op"] == "!=" else "="
        return Requirement(_key(m["key"]), op, frozenset({_value(m["value"])}))
    if m := _EXISTS.fullmatch(part):
        return Requirement(_key(m["key"]), "!exists" if m["neg"] else "exists")
    raise SelectorError(f"{part.strip()[:80]!r} is not key=value, key!=value, key in (...), "
                        f"key notin (...), key or !key")


def _key(k: str) -> str:
    if not _KEY.fullmatch(k):
        raise SelectorError(f"invalid label key {k[:80]!r}")
    return k


def _value(v: str) -> str:
    if not _VALUE.fullmatch(v):
        raise SelectorError(f"invalid label value {v[:80]!r}")
    return v
