"""``gpuscale generate`` on a workload whose GPUs come from DRA resource claims: it reads
GPUs per replica from the claim's requests and says where they come from."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given

from gpuscale.common.errors import ConfigError
from gpuscale.tools.generate import Options, generate, workload_from
from tests.support.strategies import json_values


def deployment(claim: dict[str, str], args: list[str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "llm", "namespace": "serve"},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "llm"}},
                     "template": {"metadata": {"annotations": {
                         "gpuscale.io/engine": "vllm", "gpuscale.io/metrics-port": "8000"}},
                         "spec": {"resourceClaims": [{"name": "gpus", **claim}],
                                  "containers": [{"name": "main",
                                                  "image": "vllm/vllm-openai:v0.11.0",
                                                  "args": args or [],
                                                  "resources": {"claims": [{"name": "gpus"}]}
                                                  }]}}}}


def template(*requests: dict[str, Any], kind: str = "ResourceClaimTemplate",
             name: str = "two-gpus") -> dict[str, Any]:
    spec = {"devices": {"requests": list(requests)}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": kind, "metadata": {"name": name},
            "spec": {"spec": spec} if kind == "ResourceClaimTemplate" else spec}


def exactly(count: int | None = None, cls: str = "gpu.nvidia.com", mode: str = "",
            name: str = "gpu") -> dict[str, Any]:
    ex: dict[str, Any] = {"deviceClassName": cls}
    if count is not None:
        ex["count"] = count
    if mode:
        ex["allocationMode"] = mode
    return {"name": name, "exactly": ex}


def notes_of(doc: dict[str, Any], *docs: dict[str, Any]) -> tuple[int, tuple[str, ...]]:
    w = workload_from(doc, [doc, *docs])
    return w.gpu_count, generate(w, Options()).notes


def test_gpus_per_replica_from_a_claim_template() -> None:
    count, notes = notes_of(deployment({"resourceClaimTemplateName": "two-gpus"}),
                            template(exactly(2), exactly(cls="nic.example.com", name="nic")))
    assert count == 2
    assert ("GPUs: DRA claim gpus from ResourceClaimTemplate two-gpus: gpu: 2 gpu.nvidia.com; "
            "each replica its own (ResourceClaimTemplate)") in notes
    assert notes.index(next(n for n in notes if n.startswith("GPUs: DRA"))) == 1


def test_a_parallelism_the_claim_does_not_give_is_a_warning() -> None:
    _, notes = notes_of(deployment({"resourceClaimTemplateName": "two-gpus"},
                                   ["--tensor-parallel-size", "4"]), template(exactly()))
    assert any(n.startswith("WARNING: the containers request 1 GPUs but the engine's "
                            "parallelism needs 4") for n in notes)


@pytest.mark.parametrize(("claim", "docs", "says"), [
    ({"resourceClaimName": "shared"}, [template(exactly(), kind="ResourceClaim",
                                                name="shared")],
     "ONE claim every replica shares"),
    ({"resourceClaimTemplateName": "two-gpus"}, [template(exactly(mode="All"))],
     "all gpu.nvidia.com devices of the node"),
    ({"resourceClaimTemplateName": "two-gpus"}, [template(
        {"name": "any", "firstAvailable": [{"name": "a"}, {"name": "b"}]})],
     "the first available of 2 alternatives"),
    ({"resourceClaimTemplateName": "elsewhere"}, [], "not in this manifest: GPUs per "
                                                     "replica unknown"),
])
def test_what_the_manifest_does_not_fix_is_said(claim: dict[str, str],
                                                docs: list[dict[str, Any]], says: str) -> None:
    count, notes = notes_of(deployment(claim), *docs)
    assert any(says in n for n in notes)
    if "ONE claim" not in says:
        assert count == 0  # not a number: no parallelism warning built on it


def test_a_claim_no_container_names_gives_no_gpu() -> None:
    doc = deployment({"resourceClaimTemplateName": "two-gpus"})
    doc["spec"]["template"]["spec"]["containers"][0]["resources"] = {}
    with pytest.raises(ConfigError, match="or a DRA resource claim"):
        generate(workload_from(doc, [doc, template(exactly())]), Options())


@given(json_values(["resourceClaims", "name", "resourceClaimTemplateName", "spec",
                    "devices", "requests", "exactly", "count", "allocationMode",
                    "deviceClassName", "firstAvailable", "kind", "metadata"]))
def test_hostile_claims_and_templates_never_raise_anything_but_config_errors(
        junk: object) -> None:
    doc = deployment({"resourceClaimTemplateName": "two-gpus"})
    for variant in (junk, {"kind": "ResourceClaimTemplate", "metadata": {"name": "two-gpus"},
                           "spec": junk}):
        with contextlib.suppress(ConfigError):
            workload_from(doc, [doc, variant])
    doc["spec"]["template"]["spec"]["resourceClaims"] = junk
    with contextlib.suppress(ConfigError):
        workload_from(doc, [doc])


def test_the_cli_reads_the_template_beside_the_deployment(tmp_path: Path) -> None:
    path = tmp_path / "llm.yaml"
    path.write_text(yaml.safe_dump_all([template(exactly(2)), deployment(
        {"resourceClaimTemplateName": "two-gpus"})]))
    out = subprocess.run([sys.executable, "-m", "gpuscale", "generate", str(path)],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert "# GPUs: DRA claim gpus from ResourceClaimTemplate two-gpus: gpu: 2" in out
    assert yaml.safe_load_all(out)
