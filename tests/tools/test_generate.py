"""``gpuscale generate``: what it writes validates against KEDA's CRD and the HPA schema,
its trigger metadata is what the scaler accepts, its choices follow the workload, and a
manifest it cannot use is a clear error."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings

from gpuscale.common.errors import ConfigError
from gpuscale.models.hpa import parse_behavior
from gpuscale.models.planner_behavior import PLANNER_BEHAVIOR, planner_rules
from gpuscale.models.serving import ServingParams
from gpuscale.scaler.core.trigger import parse_metadata
from gpuscale.sim.scaler_adapter import planner_policy
from gpuscale.tools.generate import (
    Generated,
    Options,
    behavior,
    detect_engine,
    engine_flags,
    generate,
    workload_from,
)
from tests.peers.kubeapi import DEPLOYMENTS, KubeApiPeer
from tests.support.kubeconfig import write_kubeconfig
from tests.support.schemas import validate
from tests.support.strategies import json_values

EXAMPLES = Path(__file__).resolve().parents[2] / "deploy" / "examples"


def deployment(image: str = "vllm/vllm-openai:v0.11.0", annotations: dict[str, str] | None
               = None, args: list[str] | None = None, gpu: bool = True) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": image, "args": args or []}
    if gpu:
        container["resources"] = {"limits": {"nvidia.com/gpu": 1}}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "llm", "namespace": "serve"},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "llm", "tier": "gpu"}},
                     "template": {"metadata": {"annotations": annotations or {}},
                                  "spec": {"containers": [container]}}}}


def workloads_in_examples() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") in ("Deployment", "StatefulSet"):
                out.append((path.name, doc))
    return out


@pytest.mark.parametrize(("name", "doc"), workloads_in_examples(), ids=lambda v: str(v)[:30])
@pytest.mark.parametrize("hpa", [False, True])
def test_what_it_writes_validates_and_the_scaler_accepts(name: str, doc: dict[str, Any],
                                                         hpa: bool) -> None:
    out = generate(workload_from(doc), Options(startup_s=240))
    validate(out.scaled_object)
    parse_metadata(out.scaled_object["spec"]["triggers"][0]["metadata"])
    if hpa:
        validate(out.hpa)


@pytest.mark.parametrize(("doc", "engine", "profile"), [
    (deployment(), "vllm", "vllm-inference"),
    (deployment("nvcr.io/nvidia/tritonserver:24.08-py3"), "triton", "triton-inference"),
    (deployment("ghcr.io/huggingface/text-generation-inference:2.4"), "tgi", "tgi-inference"),
    (deployment("python:3.11", args=["-m", "vllm.entrypoints.openai.api_server"]), "vllm",
     "vllm-inference"),
    (deployment("ghcr.io/acme/trainer:1"), "", "gpu-utilization"),
    (deployment("ghcr.io/acme/anything:1", {"gpuscale.io/engine": "tgi"}), "tgi",
     "tgi-inference"),
])
def test_the_engine_and_profile_follow_the_workload(doc: dict[str, Any], engine: str,
                                                    profile: str) -> None:
    out = generate(workload_from(doc), Options())
    assert (out.engine, out.profile) == (engine, profile)
    md = out.scaled_object["spec"]["triggers"][0]["metadata"]
    assert md["podSelector"] == "app=llm,tier=gpu"
    assert md["profile"] == profile


def test_an_engine_the_agent_will_not_scrape_is_a_warning_with_the_fix() -> None:
    out = generate(workload_from(deployment()), Options())
    warning = next(n for n in out.notes if n.startswith("WARNING"))
    assert "gpuscale.io/engine: vllm" in warning
    assert "gpuscale.io/metrics-port: '8000'" in warning
    annotated = deployment(annotations={"gpuscale.io/engine": "vllm"})
    assert not [n for n in generate(workload_from(annotated), Options()).notes
                if n.startswith("WARNING")]


def test_scale_to_zero_only_with_a_demand_source() -> None:
    w = workload_from(deployment(annotations={"gpuscale.io/engine": "vllm"}))
    with pytest.raises(ConfigError, match="needs a demand source"):
        generate(w, Options(min_replicas=0))
    out = generate(w, Options(min_replicas=0, demand_source="gateway"))
    assert out.scaled_object["spec"]["minReplicaCount"] == 0
    assert out.scaled_object["spec"]["triggers"][0]["metadata"]["demandSource"] == "gateway"
    assert out.hpa["spec"]["minReplicas"] == 0  # Kubernetes 1.37: on the demand metric
    validate(out.scaled_object)


def test_fallback_holds_the_current_replicas_and_needs_keda_2_17() -> None:
    out = generate(workload_from(deployment()), Options(min_replicas=2))
    assert out.scaled_object["spec"]["fallback"] == {
        "failureThreshold": 3, "replicas": 2, "behavior": "currentReplicasIfHigher"}
    assert any("KEDA 2.17" in n for n in out.notes)
    older = generate(workload_from(deployment()), Options(keda_version=(2, 16)))
    assert "fallback" not in older.scaled_object["spec"]  # a static one would scale down
    validate(older.scaled_object)


def test_the_replicas_it_runs_and_its_namespace_are_kept() -> None:
    doc = deployment()
    doc["spec"]["replicas"] = 12
    del doc["metadata"]["namespace"]
    out = generate(workload_from(doc), Options(max_replicas=8))
    assert out.scaled_object["spec"]["maxReplicaCount"] == 12
    assert out.hpa["spec"]["maxReplicas"] == 12
    assert "namespace" not in out.scaled_object["metadata"]  # kubectl -n decides
    assert any("raised to the 12 replicas" in n for n in out.notes)


@pytest.mark.parametrize(("startup", "window", "step"), [
    (30, 300, 60), (180, 360, 180), (600, 1200, 600), (1800, 3600, 1800)])
def test_scale_down_waits_for_two_startups_and_steps_one_replica_per_startup(
        startup: float, window: int, step: int) -> None:
    b = behavior(startup)
    assert b["scaleUp"]["stabilizationWindowSeconds"] == 0
    assert {p["periodSeconds"] for p in b["scaleUp"]["policies"]} == {15}
    assert b["scaleDown"]["stabilizationWindowSeconds"] == window
    assert b["scaleDown"]["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": step}]


def test_start_up_beyond_what_the_hpa_api_takes_is_refused() -> None:
    """The HPA API takes a policy period up to 1,800 s and a window up to 3,600 s."""
    with pytest.raises(ConfigError, match="between 0 and 1800"):
        generate(workload_from(deployment()), Options(startup_s=1801))


def test_an_argument_that_mentions_vllm_is_not_vllm() -> None:
    w = workload_from(deployment("ghcr.io/acme/server:1", args=["--cache=/data/vllm"]))
    assert detect_engine(w)[0] == ""
    w = workload_from(deployment("ghcr.io/acme/server:1", args=["vllm", "serve", "m"]))
    assert detect_engine(w)[0] == "vllm"


def test_the_planner_for_vllm_with_its_settings() -> None:
    w = workload_from(deployment(annotations={"gpuscale.io/engine": "vllm"}))
    out = generate(w, Options(planner=True, startup_s=240, ttft_s=2))
    md = out.scaled_object["spec"]["triggers"][0]["metadata"]
    assert (md["profile"], md["startupSeconds"], md["ttftSeconds"]) == \
        ("vllm-planner", "240", "2")
    assert parse_metadata(md).planner is not None
    (metric,) = out.hpa["spec"]["metrics"]
    assert metric["object"]["metric"] == {
        "name": "gpuscale_planned_replicas",
        "selector": {"matchLabels": {"startupSeconds": "240", "ttftSeconds": "2"}}}
    validate(out.hpa)
    # Without --startup-seconds the scaler measures the start-up: nothing is written.
    measured = generate(w, Options(planner=True))
    md = measured.scaled_object["spec"]["triggers"][0]["metadata"]
    assert "startupSeconds" not in md
    assert parse_metadata(md).planner.startup_s is None  # type: ignore[union-attr]
    assert any("the scaler measures it" in n for n in measured.notes)
    with pytest.raises(ConfigError, match="needs a vLLM workload"):
        generate(workload_from(deployment("ghcr.io/acme/trainer:1")), Options(planner=True))


def test_the_planner_takes_the_pods_termination_grace() -> None:
    doc = deployment(annotations={"gpuscale.io/engine": "vllm"})
    assert "drainSeconds" not in generate(workload_from(doc), Options(
        planner=True)).scaled_object["spec"]["triggers"][0]["metadata"]
    doc["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 900
    out = generate(workload_from(doc), Options(planner=True))
    md = out.scaled_object["spec"]["triggers"][0]["metadata"]
    assert md["drainSeconds"] == "900"
    assert parse_metadata(md).planner.drain_s == 900.0  # type: ignore[union-attr]
    (metric,) = out.hpa["spec"]["metrics"]  # the plain HPA's planner gets it too
    assert metric["object"]["metric"]["selector"]["matchLabels"]["drainSeconds"] == "900"
    validate(out.hpa)
    assert any("terminationGracePeriodSeconds" in n for n in out.notes)
    doc["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 100_000
    out = generate(workload_from(doc), Options(planner=True))  # beyond the trigger's bound
    md = out.scaled_object["spec"]["triggers"][0]["metadata"]
    assert md["drainSeconds"] == "86400"
    assert parse_metadata(md).planner.drain_s == 86_400.0  # type: ignore[union-attr]
    for odd in ("900", True, -1, 1.5):  # not an integer count of seconds: not taken
        doc["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = odd
        assert workload_from(doc).grace_s is None


@pytest.mark.parametrize(("doc", "words"), [
    ([], "expected a mapping"),
    ({"apiVersion": "v1", "kind": "Service"}, "Deployment or StatefulSet"),
    ({"kind": "Deployment"}, "^apiVersion: missing; a Deployment needs apiVersion: apps/v1$"),
    ({"apiVersion": "apps/v1beta2", "kind": "StatefulSet"}, "^apiVersion: 'apps/v1beta2'"),
    ({**deployment(), "metadata": {}}, "metadata.name"),
    ({**deployment(), "spec": {"selector": {"matchExpressions": [{"key": "a"}]}}},
     "matchLabels"),
    ({**deployment(), "spec": {"selector": {"matchLabels": {"a": "b"}},
                               "template": {"spec": {"containers": "x"}}}}, "expected a list"),
    (deployment(annotations={"gpuscale.io/engine": "sglang"}), "not one of"),
])
def test_manifests_it_cannot_use_are_clear_errors(doc: Any, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        generate(workload_from(doc), Options())


@settings(max_examples=200)
@given(json_values(["apiVersion", "kind", "metadata", "spec", "selector", "matchLabels",
                    "template", "containers", "image", "annotations", "name"]))
def test_any_document_is_generated_from_or_refused_clearly(doc: Any) -> None:
    try:
        out = generate(workload_from(doc), Options())
    except ConfigError:
        return
    validate(out.scaled_object)


def test_detect_engine_reads_only_the_image_name() -> None:
    """A registry or tag that mentions an engine does not make one."""
    w = workload_from(deployment("registry.vllm.example/acme/app:tritonserver"))
    assert detect_engine(w)[0] == ""


async def test_from_the_cluster(kubeapi: KubeApiPeer, tmp_path: Path) -> None:
    """--from-cluster reads the Deployment from the API server (the test peer, the same
    wire format and Status errors) with the kubeconfig's credentials."""
    obj = deployment()
    obj["metadata"]["uid"] = "uid-llm"
    kubeapi.add(obj, DEPLOYMENTS)
    config = write_kubeconfig(tmp_path / "config", f"http://127.0.0.1:{kubeapi.port}",
                              {"token": kubeapi.token})

    def generate_cmd(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gpuscale.cli", "generate", *args],
                              capture_output=True, text=True, timeout=60, check=False)

    got = await asyncio.to_thread(generate_cmd, "--from-cluster", "deployment/llm", "-n",
                                  "serve", "--kubeconfig", str(config))
    assert got.returncode == 0, got.stderr
    [so] = list(yaml.safe_load_all(got.stdout))
    assert so["spec"]["scaleTargetRef"]["name"] == "llm"
    assert so["metadata"]["namespace"] == "serve"
    validate(so)
    missing = await asyncio.to_thread(generate_cmd, "--from-cluster", "deployment/nope",
                                      "-n", "serve", "--kubeconfig", str(config))
    assert missing.returncode == 1
    assert 'deployments.apps "nope" not found' in missing.stderr
    stale = write_kubeconfig(tmp_path / "stale", f"http://127.0.0.1:{kubeapi.port}",
                             {"token": "rotated"})
    denied = await asyncio.to_thread(generate_cmd, "--from-cluster", "deployment/llm", "-n",
                                     "serve", "--kubeconfig", str(stale))
    assert denied.returncode == 1
    assert "401" in denied.stderr
    for bad in (["--from-cluster", "cronjob/llm"], ["--from-cluster", "deployment/"], []):
        wrong = await asyncio.to_thread(generate_cmd, *bad, "--kubeconfig", str(config))
        assert wrong.returncode == 2, wrong.stderr
        assert "Traceback" not in wrong.stderr


def _planner(args: list[str], gpus: int = 1, annotations: dict[str, str] | None = None,
             **opts: Any) -> Generated:
    doc = deployment(args=args, annotations=annotations)
    doc["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"][
        "nvidia.com/gpu"] = gpus
    return generate(workload_from(doc), Options(planner=True, **opts))


@pytest.mark.parametrize("args", [
    ["--model", "m", "--max-num-seqs", "128"], ["--max-num-seqs=128"],
    ["--max-num-seqs", "64", "--max-num-seqs", "128"],  # the last one wins, as in argparse
])
def test_the_planner_takes_the_engines_batch_from_its_flags(args: list[str]) -> None:
    out = _planner(args)
    md = out.scaled_object["spec"]["triggers"][0]["metadata"]
    assert md["maxBatch"] == "128"
    cfg = parse_metadata(md).planner
    assert cfg is not None
    assert cfg.max_batch == 128
    (metric,) = out.hpa["spec"]["metrics"]
    assert metric["object"]["metric"]["selector"]["matchLabels"]["maxBatch"] == "128"
    assert any("--max-num-seqs" in n for n in out.notes)


def test_flags_that_are_not_numbers_leave_the_defaults() -> None:
    out = _planner(["--max-num-seqs", "$(SEQS)", "--port"])
    assert "maxBatch" not in out.scaled_object["spec"]["triggers"][0]["metadata"]


def test_parallelism_is_gpus_per_replica_checked_against_the_request() -> None:
    out = _planner(["--tensor-parallel-size", "4", "-pp", "2"], gpus=4)
    assert "GPUs per replica: 8 (tensor-parallel 4 x pipeline-parallel 2)" in out.notes
    assert any(n.startswith("WARNING: the containers request 4 GPUs but the "
                            "engine's parallelism needs 8") for n in out.notes)
    assert any(n.startswith("capacity:") for n in out.notes)
    assert not any(n.startswith("WARNING: the containers")
                   for n in _planner(["-tp=2"], gpus=2).notes)


def test_the_metrics_port_hint_follows_the_engines_port() -> None:
    out = generate(workload_from(deployment(args=["--port", "9000"])), Options())
    (hint,) = [n for n in out.notes if "opt in" in n]
    assert "gpuscale.io/metrics-port: '9000' (its --port)" in hint
    triton = generate(workload_from(deployment("nvcr.io/nvidia/tritonserver:24.08-py3",
                                               args=["--metrics-port=9102"])), Options())
    assert any("'9102' (its --metrics-port)" in n for n in triton.notes)
    wrong = _planner(["--port", "9000"], annotations={"gpuscale.io/engine": "vllm",
                                                      "gpuscale.io/metrics-port": "8000"})
    assert any("serve on 9000: the agent would scrape the wrong port" in n
               for n in wrong.notes)


def _first_yaml(path: Path) -> Any:
    text = path.read_text()
    block = text[text.index("```yaml") + 7:]
    return yaml.safe_load(block[:block.index("```")])


def test_the_planners_behavior_is_one_everywhere_it_is_shown() -> None:
    """The planner's HPA behavior (models.planner_behavior: no scale-down window or step
    of its own, tolerance 0 both ways) is what docs/planner.md, the README, the examples
    and generate - for KEDA and for the plain HPA - write, and what the simulator runs."""
    root = Path(__file__).resolve().parents[2]
    shown = [_first_yaml(root / "docs" / "planner.md")["advanced"],
             yaml.safe_load((root / "deploy/examples/vllm-planner.yaml").read_text()
                            .split("---")[-1])["spec"]["advanced"]]
    readme = (root / "README.md").read_text()
    shown.append(yaml.safe_load(readme[readme.index("apiVersion: keda.sh"):].split(
        "```")[0])["spec"]["advanced"])
    behaviors = [s["horizontalPodAutoscalerConfig"]["behavior"] for s in shown]
    behaviors.append(yaml.safe_load((root / "deploy/examples/hpa/vllm-scale-to-zero.yaml")
                                    .read_text())["spec"]["behavior"])
    for b in behaviors:
        assert b == PLANNER_BEHAVIOR
    out = _planner([])
    so = out.scaled_object["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    for got in (so, out.hpa["spec"]["behavior"]):
        assert got["scaleDown"] == PLANNER_BEHAVIOR["scaleDown"]
        assert got["scaleUp"]["tolerance"] == 0  # the default scale-up policies, spelt out
        assert parse_behavior(json.dumps(got)) == planner_rules()
    assert planner_policy(ServingParams())["scale_up"] == planner_rules()[0]
    assert planner_policy(ServingParams())["scale_down"] == planner_rules()[1]
    assert planner_rules()[1].stabilization_s == 0.0
    assert planner_rules()[0].tolerance == planner_rules()[1].tolerance == 0.0
    validate(out.scaled_object)
    validate(out.hpa)


def test_options_that_would_do_nothing_and_workloads_without_gpus_are_refused() -> None:
    with pytest.raises(ConfigError, match="--ttft-seconds: only with --planner"):
        generate(workload_from(deployment()), Options(ttft_s=2.0))
    with pytest.raises(ConfigError,
                       match=r"no container requests an nvidia\.com/ or amd\.com/ GPU"):
        generate(workload_from(deployment(gpu=False)), Options())
    path = EXAMPLES / "vllm.yaml"
    no_gpu = path.read_text().replace("nvidia.com/gpu", "example.com/widget")
    for argv, stdin, why in (
            ([str(path), "--ttft-seconds", "2"], "", "--ttft-seconds: only with --planner"),
            (["-"], no_gpu, "no container requests")):
        got = subprocess.run([sys.executable, "-m", "gpuscale.cli", "generate", *argv],
                             input=stdin, capture_output=True, text=True, timeout=60,
                             check=False)
        assert got.returncode == 2, got.stdout
        assert got.stderr.startswith("gpuscale: ")
        assert why in got.stderr
        assert len(got.stderr.splitlines()) == 1
        assert got.stdout == ""


def test_scale_to_zero_for_a_plain_hpa_wakes_on_the_demand_source() -> None:
    out = generate(workload_from(deployment()), Options(min_replicas=0, demand_source="gw"))
    spec = out.hpa["spec"]
    assert spec["minReplicas"] == 0
    demand = spec["metrics"][-1]["object"]
    assert demand["metric"] == {"name": "gpuscale_demand_pending",
                                "selector": {"matchLabels": {"demandSource": "gw"}}}
    assert demand["target"] == {"type": "AverageValue", "averageValue": "1"}
    assert any("Kubernetes 1.37" in n for n in out.notes)
    validate(out.hpa)
    assert out.scaled_object["spec"]["minReplicaCount"] == 0


def test_engine_flags_are_read_from_the_engine_container_only() -> None:
    """A sidecar's --port (an auth proxy's) is not the engine's metrics port, and a digit
    that is not ASCII is not a number."""
    doc = deployment(args=["--max-num-seqs", "96"])
    doc["spec"]["template"]["spec"]["containers"].append(
        {"name": "proxy", "image": "quay.io/oauth2-proxy/oauth2-proxy:v7",
         "args": ["--port", "4180", "--max-num-seqs", "7"]})
    out = generate(workload_from(doc), Options(planner=True))
    assert out.scaled_object["spec"]["triggers"][0]["metadata"]["maxBatch"] == "96"
    (hint,) = [n for n in out.notes if "opt in" in n]
    assert "'8000'" in hint
    assert engine_flags("vllm", ["--max-num-seqs", "\u00b2", "--port", "\u0663"]) == {}
