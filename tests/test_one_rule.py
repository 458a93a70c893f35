"""Each rule is written once: a contract on the code itself, not only on its imports.

import-linter's "one place" contract forbids importing a module; a rule written again
without the import passes it (explain and the simulator each decided activity again, and
top and the recorder judged freshness by hand, all with the right imports). This test reads
the syntax tree of every module under src/gpuscale and fails where a rule is *computed*
outside its one place:

- activity (scaler/answers.py: ``activity``): an ordering comparison with anything named
  ``*activation*`` (a value against its activation threshold); an assignment to anything
  named ``*active*`` whose value contains an ordering comparison; a ``return`` of one in a
  function named ``*active*``. models/keda.py is KEDA's model and may hold KEDA's own
  rules (its built-in scalers' activationThreshold, fallback counting as active).
- freshness (common/freshness.py: ``is_stale``, ``staleness_bound``): an ordering
  comparison with anything named ``*stale*``, or of an ``age`` with a ``*bound*``; any use
  of the rule's constants (``STALE_AFTER_INTERVALS``, ``MIN_STALE_S``).
- KEDA's semantics (models/keda.py): a comparison with a fallback behaviour's name, or an
  ordering comparison with a cooldown or a failure threshold.

What it cannot see is a rule rewritten under other names (a threshold called ``floor``);
the one-answer test (tests/scaler/test_one_answer.py) compares the places' outputs at one
instant for that.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "gpuscale"
ORDERING = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)
BEHAVIORS = {"currentReplicas", "currentReplicasIfHigher", "currentReplicasIfLower"}
AGE = re.compile(r"(^|_)age$")

ACTIVITY_HOME = {"scaler/answers.py", "models/keda.py"}
FRESHNESS_HOME = {"common/freshness.py"}
KEDA_HOME = {"models/keda.py"}


def _names(node: ast.AST) -> set[str]:
    return {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node)
            if isinstance(n, ast.Name | ast.Attribute)}


def _ordering(node: ast.AST) -> Iterator[ast.Compare]:
    for n in ast.walk(node):
        if isinstance(n, ast.Compare) and any(isinstance(o, ORDERING) for o in n.ops):
            yield n


def violations(tree: ast.AST, module: str) -> list[str]:
    """What ``module`` (a path under src/gpuscale) computes that is another's rule."""
    out: list[str] = []

    def say(rule: str, node: ast.AST) -> None:
        out.append(f"{module}:{getattr(node, 'lineno', 0)}: {rule}: "
                   f"{ast.unparse(node)[:100]}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            names = _names(node)
            ordering = any(isinstance(o, ORDERING) for o in node.ops)
            consts = {c.value for c in ast.walk(node) if isinstance(c, ast.Constant)}
            if module not in ACTIVITY_HOME and ordering and \
                    any("activation" in n.lower() for n in names):
                say("activity (use scaler.answers.activity)", node)
            if module not in FRESHNESS_HOME and ordering and (
                    any("stale" in n.lower() for n in names) or
                    (any(AGE.search(n) for n in names) and any("bound" in n for n in names))):
                say("freshness (use common.freshness.is_stale)", node)
            if module not in KEDA_HOME and (consts & BEHAVIORS or (ordering and any(
                    "cooldown" in n.lower() or "failure_threshold" in n or
                    "fallback_failures" in n for n in names))):
                say("KEDA's semantics (use models.keda)", node)
        if module not in FRESHNESS_HOME and isinstance(node, ast.Name) and \
                node.id in ("STALE_AFTER_INTERVALS", "MIN_STALE_S"):
            say("freshness arithmetic (use common.freshness.staleness_bound)", node)
        if module in ACTIVITY_HOME:
            continue
        if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign) and \
                node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any("active" in n.lower() for t in targets for n in _names(t)) and \
                    any(True for _ in _ordering(node.value)):
                say("activity (use scaler.answers.activity)", node)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and \
                "active" in node.name.lower():
            for r in ast.walk(node):
                if isinstance(r, ast.Return) and r.value is not None and \
                        any(True for _ in _ordering(r.value)):
                    say("activity (use scaler.answers.activity)", r)
    return out


def modules() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if "proto" not in p.relative_to(SRC).parts)


def test_each_rule_is_computed_in_its_one_place() -> None:
    found = [v for p in modules()
             for v in violations(ast.parse(p.read_text()), p.relative_to(SRC).as_posix())]
    assert found == []


@pytest.mark.parametrize(("module", "code"), [
    # What explain, the simulator, top, the recorder and the aggregation each wrote before
    # the rules had one place: the contract must catch every one of them.
    ("tools/explain.py", "active = any(a.value > a.activation for a in readable)"),
    ("sim/simulate.py", "active = len(model.queue) > 0 or any(v > 0 for v in values)"),
    ("tools/top.py", "stale = node.age > reply.stale_after > 0"),
    ("scaler/recorder.py", "live = [n for n in nodes if ages[n] <= fleet.stale_after]"),
    ("scaler/core/aggregate.py", "if age > bound:\n    pass"),
    ("demo/loop.py", "bound = max(STALE_AFTER_INTERVALS * interval, 2.0)"),
    ("tools/explain.py", "def _is_active(a):\n    return a.value > 5.0"),
    ("tools/explain.py", "if behavior == 'currentReplicasIfLower':\n    pass"),
    ("tools/explain.py", "if since >= st.cooldown_period:\n    pass"),
])
def test_the_contract_catches_a_rule_written_again(module: str, code: str) -> None:
    assert violations(ast.parse(code), module)


def test_the_rules_own_places_may_compute_them() -> None:
    assert not violations(ast.parse("ok = got.value > target.activation"),
                          "scaler/answers.py")
    assert not violations(ast.parse("ok = age_s > bound_s"), "common/freshness.py")
