"""The manifests in deploy/: rendered with kustomize, validated against the Kubernetes
schemas of a pinned version and the shared CRDs, RBAC equal to the calls the code makes,
the PrometheusRule equal to the shipped rule file and unit-tested with promtool; the
examples, the compose files, the image and the dashboard. The Helm chart: test_helm."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from gpuscale.kube import access
from gpuscale.scaler.core.trigger import parse_metadata
from tests.deploy.rendered import (
    AGENTS,
    DASHBOARD,
    DEPLOY,
    REPO,
    by_kind,
    container_args,
    helm_render,
    named,
    rbac_rules,
    render,
)
from tests.support.repo import SCHEMAS
from tests.support.schemas import validate


@pytest.mark.parametrize("path", ["kustomize/base", "kustomize/overlays/host-pid",
                                  "kustomize/overlays/tls", "kustomize/overlays/production",
                                  "kustomize/overlays/metrics-api"])
def test_every_rendered_object_validates(path: str) -> None:
    objs = render(path)
    assert len(objs) >= 15
    for obj in objs:
        validate(obj)
    names = {(o["kind"], o["metadata"]["name"]) for o in objs}
    assert {("DaemonSet", "gpuscale-agent"), ("DaemonSet", "gpuscale-agent-amd"),
            ("Deployment", "gpuscale-scaler"),
            ("Service", "gpuscale-agent"), ("Service", "gpuscale-scaler"),
            ("PodDisruptionBudget", "gpuscale-scaler"), ("NetworkPolicy", "gpuscale-agent"),
            ("NetworkPolicy", "gpuscale-scaler"), ("ServiceMonitor", "gpuscale"),
            ("PrometheusRule", "gpuscale")} <= names


def test_a_broken_object_is_caught() -> None:
    """The validation above can fail: a typo'd field is rejected."""
    ds = dict(named(render("kustomize/base"), "DaemonSet", "gpuscale-agent"))
    ds["spec"] = {**ds["spec"], "replicas": 3}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(ds)
    sm = dict(by_kind(render("kustomize/base"), "ServiceMonitor")[0])
    sm["spec"] = {**sm["spec"], "endpoints": "not-a-list"}
    with pytest.raises(jsonschema.ValidationError):
        validate(sm)


def test_agent_daemonset_contract() -> None:
    ds = named(render("kustomize/base"), "DaemonSet", "gpuscale-agent")
    pod = ds["spec"]["template"]["spec"]
    (agent,) = pod["containers"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    keys = {e["key"] for t in terms["nodeSelectorTerms"] for e in t["matchExpressions"]}
    assert keys == {"nvidia.com/gpu.present", "feature.node.kubernetes.io/pci-10de.present"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in \
        pod["tolerations"]
    assert "nvidia.com/gpu" not in str(agent["resources"])  # sees all GPUs, takes none
    mount = next(m for m in agent["volumeMounts"] if m["name"] == "pod-resources")
    assert (mount["mountPath"], mount["readOnly"]) == ("/var/lib/kubelet/pod-resources", True)
    sc = agent["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["runAsUser"] == 0  # the kubelet socket is root-only on most hosts
    non_root = named(helm_render({"agent": {"runAsNonRoot": True, "socketGroup": 998}}),
                     "DaemonSet", "gpuscale-agent")
    nsc = non_root["spec"]["template"]["spec"]["containers"][0]["securityContext"]
    assert (nsc["runAsNonRoot"], nsc["runAsUser"], nsc["runAsGroup"]) == (True, 65532, 998)
    amd = named(helm_render({"agent": {"runAsNonRoot": True, "socketGroup": 998}}),
                "DaemonSet", "gpuscale-agent-amd")  # the AMD agent follows the same choice
    asc = amd["spec"]["template"]["spec"]["containers"][0]["securityContext"]
    assert (asc["runAsNonRoot"], asc["runAsUser"], asc["runAsGroup"]) == (True, 65532, 998)
    assert "hostPID" not in pod
    assert {"readinessProbe", "livenessProbe"} <= set(agent)
    for name in AGENTS:
        host_pid = named(render("kustomize/overlays/host-pid"), "DaemonSet", name)
        assert host_pid["spec"]["template"]["spec"]["hostPID"] is True


def test_amd_agent_daemonset_contract() -> None:
    """AMD nodes (the AMD GPU operator's label, or NFD's AMD PCI label) without NVIDIA
    GPUs get their own agent: the AMD backend, the device nodes the library opens, no GPU
    taken from the workloads, locked down unless asked; its pods are agents to the
    Service and NetworkPolicy; Helm can turn it off, use the host's ROCm, or privilege it."""
    objs = render("kustomize/base")
    ds = named(objs, "DaemonSet", "gpuscale-agent-amd")
    nvidia = named(objs, "DaemonSet", "gpuscale-agent")
    pod = ds["spec"]["template"]["spec"]
    (agent,) = pod["containers"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    for term in terms["nodeSelectorTerms"]:  # never a node the NVIDIA agent takes
        exprs = {(e["key"], e["operator"]) for e in term["matchExpressions"]}
        assert {("nvidia.com/gpu.present", "NotIn"),
                ("feature.node.kubernetes.io/pci-10de.present", "NotIn")} <= exprs
    wanted = {e["key"] for t in terms["nodeSelectorTerms"] for e in t["matchExpressions"]
              if e["operator"] == "In"}
    assert wanted == {"feature.node.kubernetes.io/amd-gpu",
                      "feature.node.kubernetes.io/pci-1002.present"}
    assert agent["args"][:2] == ["agent", "--gpu-backend=amd"]
    assert "amd.com/gpu" not in str(agent["resources"])  # sees all GPUs, takes none
    mounts = {m["name"]: m for m in agent["volumeMounts"]}
    assert (mounts["kfd"]["mountPath"], mounts["dri"]["mountPath"]) == ("/dev/kfd", "/dev/dri")
    assert not mounts["kfd"].get("readOnly")  # the library opens them read-write
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["kfd"]["hostPath"] == {"path": "/dev/kfd", "type": "CharDevice"}
    sc = agent["securityContext"]
    assert (sc["capabilities"]["drop"], sc["allowPrivilegeEscalation"]) == (["ALL"], False)
    assert "privileged" not in sc
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert nvidia["spec"]["selector"]["matchLabels"].items() <= labels.items()
    service = named(objs, "Service", "gpuscale-agent")
    assert service["spec"]["selector"].items() <= labels.items()
    assert not [o for o in helm_render({"agent": {"amd": {"enabled": False}}})
                if o["metadata"]["name"] == "gpuscale-agent-amd"]
    host = named(helm_render({"agent": {"amd": {"rocmPath": "/opt/rocm-7.0.2",
                                                "privileged": True}}}),
                 "DaemonSet", "gpuscale-agent-amd")
    hpod = host["spec"]["template"]["spec"]
    assert hpod["containers"][0]["image"].endswith(":0.1.0")  # the plain image
    assert {"name": "rocm", "hostPath": {"path": "/opt/rocm-7.0.2", "type": "Directory"}} \
        in hpod["volumes"]
    assert hpod["containers"][0]["securityContext"]["privileged"] is True
    for obj in helm_render({"agent": {"amd": {"rocmPath": "/opt/rocm", "privileged": True}}}):
        validate(obj)


@pytest.mark.parametrize("rendering", ["kustomize/overlays/tls", "kustomize/overlays/production",
                                       "kustomize/overlays/metrics-api", "helm defaults"])
def test_production_paths_leave_no_plaintext(rendering: str) -> None:
    """Production (overlays/production, Helm's defaults, overlays/metrics-api on top) is
    mutual TLS on both links: KEDA -> scaler (--tls-*) and scaler -> agents
    (--agent-tls-* / --stream-tls-*); the metrics API is HTTPS with a Secret of its own."""
    objs = helm_render(None) if rendering == "helm defaults" else render(rendering)
    args = container_args(objs)
    assert not [a for a in args if "insecure" in a]
    for flag in ("--stream-tls-cert=", "--stream-tls-key=", "--stream-tls-ca=",
                 "--agent-tls-cert=", "--agent-tls-key=", "--agent-tls-ca=",
                 "--tls-cert=", "--tls-key=", "--tls-ca="):
        assert [a for a in args if a.startswith(flag)], flag
    secrets = {v["secret"]["secretName"] for o in objs if o["kind"] in ("DaemonSet", "Deployment")
               for v in o["spec"]["template"]["spec"]["volumes"] if "secret" in v}
    metrics_api = {"gpuscale-metrics-api-tls"} if "metrics-api" in rendering else set()
    assert secrets == {"gpuscale-agent-tls", "gpuscale-scaler-tls"} | metrics_api


@pytest.mark.parametrize("rendering", ["kustomize/base", "kustomize/overlays/host-pid",
                                       "kustomize/overlays/tls", "kustomize/overlays/production",
                                       "kustomize/overlays/metrics-api", "helm defaults"])
def test_container_args_are_the_cli_s_own_flags(rendering: str) -> None:
    """Every flag the manifests pass is one `gpuscale` has, spelled in full (argparse
    would also take a prefix), and the arguments parse."""
    import argparse

    from gpuscale.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    objs = helm_render(None) if rendering == "helm defaults" else render(rendering)
    for o in objs:
        if o["kind"] in ("DaemonSet", "Deployment"):
            for c in o["spec"]["template"]["spec"]["containers"]:
                command, *flags = c["args"]
                known = sub.choices[command]._option_string_actions
                assert [f for f in flags if f.split("=")[0] not in known] == [], command
                assert parser.parse_args(c["args"]).command == c["name"]


def test_plaintext_only_where_it_says_so() -> None:
    """base (and Helm with tls.enabled=false) is the trial install: plaintext on both links,
    each by its explicit flag (the binaries refuse plaintext without one)."""
    for objs in (render("kustomize/base"), helm_render({"tls": {"enabled": False}})):
        args = container_args(objs)
        assert {"--stream-insecure", "--agents-insecure"} <= set(args)
        assert not [a for a in args if "-tls-" in a]


@pytest.mark.parametrize("path", ["kustomize/base", "kustomize/overlays/metrics-api"])
def test_rbac_grants_exactly_what_the_code_calls(path: str) -> None:
    """gpuscale's own roles; the metrics API's built-in ones: test_metrics_api."""
    objs = render(path)
    roles = {(o["kind"], o["metadata"]["name"]): rbac_rules(o)
             for o in objs if o["kind"] in ("ClusterRole", "Role")}
    assert roles[("ClusterRole", "gpuscale-agent")] == set(access.AGENT)
    assert roles[("ClusterRole", "gpuscale-scaler")] == set(access.SCALER)
    assert roles[("Role", "gpuscale-scaler")] == set(access.SCALER_NAMESPACED)


def test_prometheusrule_is_the_shipped_rule_file() -> None:
    rule = by_kind(render("kustomize/base"), "PrometheusRule")[0]
    shipped = yaml.safe_load((DEPLOY / "prometheus" / "gpuscale-rules.yaml").read_text())
    assert rule["spec"] == shipped


@pytest.mark.slow
def test_rules_fire_and_stay_quiet_in_promtool() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not found: ./dev test installs Debian's prometheus package")
    out = subprocess.run([promtool, "test", "rules",
                          str(DEPLOY / "prometheus" / "gpuscale-rules.test.yaml")],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("example", sorted((DEPLOY / "examples").glob("*.yaml")),
                         ids=lambda p: p.name)
def test_examples_validate_and_their_metadata_parses(example: Path) -> None:
    docs = [d for d in yaml.safe_load_all(example.read_text()) if d]
    triggers = 0
    for doc in docs:
        validate(doc)
        if doc["kind"] != "ScaledObject":
            continue
        for trig in doc["spec"]["triggers"]:
            if trig["type"] == "external" and "gpuscale" in trig["metadata"]["scalerAddress"]:
                parse_metadata(trig["metadata"])
                triggers += 1
    assert triggers >= 1


def test_compose_file_validates_against_the_compose_spec() -> None:
    import json

    schema = json.loads((SCHEMAS / "compose-spec.json").read_text())
    validator = jsonschema.Draft7Validator(schema)
    for name in ("compose.yaml", "compose.gpu.yaml"):
        validator.validate(yaml.safe_load((REPO / name).read_text()))
    compose = yaml.safe_load((REPO / "compose.yaml").read_text())
    assert {"agent", "scaler", "prometheus"} <= set(compose["services"])
    bad = {**compose, "services": {"agent": {"image": 3}}}
    assert not validator.is_valid(bad)


def test_dashboard_queries_only_series_gpuscale_exports() -> None:
    """Every metric the Grafana dashboard queries is one the agent or scaler exposes."""
    import json

    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\b((?:DCGM_FI|gpuscale)_[A-Za-z_]+)", e)}
    sources = "\n".join(p.read_text() for p in (REPO / "src" / "gpuscale").rglob("*.py"))
    for metric in used:
        base = re.sub(r"_(bucket|total|count|sum)$", "", metric)
        assert f'"{base}' in sources, f"{metric} is not exported by gpuscale"
    assert len(used) >= 10


def test_image_constraints_pin_every_runtime_dependency() -> None:
    """The image installs with deploy/image-constraints.txt: every direct dependency in
    pyproject.toml must be pinned there (a new one would otherwise float)."""
    import tomllib

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = {re.split(r"==", line)[0].lower().replace("_", "-")
            for line in (DEPLOY / "image-constraints.txt").read_text().splitlines() if line}
    for dep in deps:
        name = re.split(r"[<>=!~ ;\[]", dep)[0].lower().replace("_", "-")
        assert name in pins, f"{name} is not pinned in deploy/image-constraints.txt"
    assert "COPY pyproject.toml README.md deploy/image-constraints.txt" in (
        REPO / "Dockerfile").read_text()


def test_the_rocm_image_carries_the_rocm_its_amdsmi_was_made_for() -> None:
    """The AMD agent refuses a ROCm whose major.minor is not its amdsmi package's: the
    image's ROCm release is the pinned package's, and the default target stays the plain
    image (the last stage)."""
    text = (REPO / "Dockerfile").read_text()
    pin = re.search(r"^amdsmi==(\S+)$", (DEPLOY / "image-constraints.txt").read_text(),
                    re.MULTILINE)
    rocm = re.search(r"^ARG ROCM_VERSION=(\S+)$", text, re.MULTILINE)
    assert pin
    assert rocm
    assert rocm.group(1) == pin.group(1)
    stages = re.findall(r"^FROM \S+(?: AS (\w+))?$", text, re.MULTILINE)
    assert stages == ["build", "rocm", ""]


def test_the_dashboard_is_provisioned_by_helm_and_compose() -> None:
    """Helm: a ConfigMap for Grafana's sidecar holding the dashboard file as it is;
    compose: Grafana with the datasource, the provider and the same file mounted."""
    import json

    objs = helm_render({"grafanaDashboard": {"enabled": True, "namespace": "monitoring"}})
    (cm,) = [o for o in objs if o["kind"] == "ConfigMap"]
    validate(cm)
    assert cm["metadata"]["labels"] == {"grafana_dashboard": "1"}
    assert cm["metadata"]["namespace"] == "monitoring"
    assert json.loads(cm["data"]["gpuscale.json"]) == json.loads(DASHBOARD.read_text())
    assert not [o for o in helm_render(None) if o["kind"] == "ConfigMap"]
    grafana = yaml.safe_load((REPO / "compose.yaml").read_text())["services"]["grafana"]
    for volume in grafana["volumes"]:
        source = REPO / volume.split(":")[0]
        assert source.exists(), volume
    provider = yaml.safe_load((DEPLOY / "grafana" / "dashboards.yaml").read_text())
    mounted = {v.split(":")[1]: REPO / v.split(":")[0] for v in grafana["volumes"]}
    folder = mounted[provider["providers"][0]["options"]["path"]]
    assert (folder / "gpuscale.json").read_text() == DASHBOARD.read_text()
    titles = {p["title"] for p in json.loads(DASHBOARD.read_text())["panels"]}
    assert {"Fleet GPU utilization (mean over GPUs)",
            "Idle GPUs: held by a pod, under 10 % for 15 minutes",
            "Workload value vs replicas (KEDA, kube-state-metrics, the planner)"} <= titles


