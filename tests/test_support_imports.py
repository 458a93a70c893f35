"""Every test run loads conftest.py; it must not load the heavy libraries only some tests
need. Those sit behind the helpers in tests/support/ that use them (pki: cryptography;
schemas: jsonschema, kubernetes_validate), imported by the tests that do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HEAVY = ("cryptography", "jsonschema", "kubernetes_validate", "helm_python")
REPO = Path(__file__).resolve().parents[1]
LIGHT_HELPERS = ("agents", "clock", "kubeconfig", "polling", "ports", "processes",
                 "repo", "strategies")


def heavy_after(*modules: str) -> list[str]:
    """The heavy libraries a fresh interpreter has loaded once it imported ``modules``."""
    probe = (f"import sys\nimport {', '.join(modules)}\n"
             f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True,
                         text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_conftest_and_the_light_helpers_load_no_heavy_library() -> None:
    assert heavy_after("tests.conftest",
                       *(f"tests.support.{m}" for m in LIGHT_HELPERS)) == []


def test_the_probe_sees_what_a_helper_loads() -> None:
    """The check above can fail: the helpers that need a heavy library are seen to load it."""
    assert heavy_after("tests.support.pki") == ["cryptography"]
    assert heavy_after("tests.support.schemas") == ["jsonschema", "kubernetes_validate"]
