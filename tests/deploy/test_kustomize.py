"""deploy/'s kustomizations are written for the kustomize of the kubectl people run today
(v5: kubectl 1.27 or later, docs/deploy.md): no field it calls deprecated, so that
``kubectl apply -k`` prints no warning. A check of the files that always runs, and the
real kubectl's own words (tests/deploy/rendered.py: the cluster toolchain's v1.37.2 when
built)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.rendered import DEPLOY, KUSTOMIZATIONS, kubectl, kustomize

#: What kustomize v5 warns on ("... is deprecated. Please use ...") and what replaces it.
DEPRECATED = {"bases": "resources", "patchesStrategicMerge": "patches",
              "patchesJson6902": "patches", "commonLabels": "labels",
              "imageTags": "images", "vars": "replacements"}


def kustomization_files() -> list[Path]:
    return sorted(DEPLOY.rglob("kustomization.y*ml"))


def test_every_kustomization_is_rendered_by_the_tests() -> None:
    assert {str(p.parent.relative_to(DEPLOY)) for p in kustomization_files()} == \
        set(KUSTOMIZATIONS)


@pytest.mark.parametrize("path", kustomization_files(), ids=lambda p: p.parent.name)
def test_no_field_kustomize_v5_calls_deprecated(path: Path) -> None:
    doc = yaml.safe_load(path.read_text())
    assert doc["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    assert doc["kind"] == "Kustomization"
    used = {k: f"{k}: use {DEPRECATED[k]}" for k in doc if k in DEPRECATED}
    assert not used, f"{path}: {used}"
    for patch in doc.get("patches", []):  # a file beside it, not an inline patch
        assert set(patch) <= {"path", "target"}
        assert (path.parent / patch["path"]).is_file()


@pytest.mark.parametrize("path", KUSTOMIZATIONS)
def test_kubectl_renders_each_without_a_warning(path: str) -> None:
    out, err = kustomize(path)
    assert out.strip()
    assert "deprecated" not in err.lower(), f"{kubectl()} kustomize deploy/{path}: {err}"
    assert not err.strip(), err


def test_a_deprecated_field_is_caught_by_the_check_and_by_kubectl(tmp_path: Path) -> None:
    """The check above can fail: the kubectl that renders warns on such a field."""
    base = tmp_path / "base"
    base.mkdir()
    (base / "cm.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n")
    (base / "kustomization.yaml").write_text("resources: [cm.yaml]\n")
    (tmp_path / "kustomization.yaml").write_text("bases: [base]\n")
    err = subprocess.run([kubectl(), "kustomize", str(tmp_path)], capture_output=True,
                         text=True, check=True).stderr
    assert "'bases' is deprecated" in err
