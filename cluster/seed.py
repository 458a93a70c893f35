"""The pipeline the DCGM guides build, with gpuscale's agent as the exporter: agents ->
Prometheus (Debian's, scraping the agents the real EndpointSlices name, with the target
labels prometheus-operator adds) -> a recording rule that copies
the pod back from ``exported_pod`` -> the real prometheus-adapter with the guide's rule ->
``custom.metrics.k8s.io`` -> the real HPA. Both programs run in the cluster's namespace."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import yaml

from cluster.layout import Layout, host_service
from cluster.pki import Authority

PROMETHEUS_ADDR = "127.0.0.1:9091"
ADAPTER_PORT = 6445
NAMESPACE = "monitoring"
SERVICE = "prometheus-adapter"

RECORDING_RULE = (
    'label_replace(label_replace(DCGM_FI_DEV_GPU_UTIL, "pod", "$1", "exported_pod", "(.+)"),'
    ' "namespace", "$1", "exported_namespace", "(.+)")')
ADAPTER_RULE = {
    "seriesQuery": 'pod_gpu_utilization{pod!=""}',
    "resources": {"overrides": {"namespace": {"resource": "namespace"},
                                "pod": {"resource": "pod"}}},
    "metricsQuery": "avg(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)",
}


def targets(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """file_sd target groups for the agents' metrics ports, from their Service's real
    EndpointSlices, with the target labels prometheus-operator's ServiceMonitor adds
    (``namespace``, ``pod``): the agent's own pod/namespace labels then come out as
    ``exported_pod``/``exported_namespace``, which the recording rule undoes. (Debian's
    Prometheus is built without Kubernetes service discovery.)"""
    groups = []
    for s in slices:
        port = next((p["port"] for p in s.get("ports") or [] if p.get("name") == "metrics"),
                    None)
        for ep in s.get("endpoints") or []:
            ref = ep.get("targetRef") or {}
            if port is None or not ep.get("addresses") or ref.get("kind") != "Pod":
                continue
            groups.append({"targets": [f"{ep['addresses'][0]}:{port}"],
                           "labels": {"namespace": ref.get("namespace", ""),
                                      "pod": ref.get("name", "")}})
    return groups


def prometheus_files(directory: Path, groups: list[dict[str, Any]]) -> Path:
    """prometheus.yml, its rules and its targets in ``directory``; the config's path."""
    directory.mkdir(parents=True, exist_ok=True)
    rules = {"groups": [{"name": "seed", "rules": [
        {"record": "pod_gpu_utilization", "expr": RECORDING_RULE}]}]}
    (directory / "rules.yml").write_text(yaml.safe_dump(rules))
    (directory / "agents.json").write_text(json.dumps(groups))
    config = {"global": {"scrape_interval": "5s", "evaluation_interval": "5s"},
              "rule_files": [str(directory / "rules.yml")],
              "scrape_configs": [{"job_name": "gpuscale-agent", "file_sd_configs": [
                  {"files": [str(directory / "agents.json")], "refresh_interval": "5s"}]}]}
    path = directory / "prometheus.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def prometheus_argv(config: Path, data: Path) -> list[str]:
    return ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={data}",
            f"--web.listen-address={PROMETHEUS_ADDR}", "--log.level=warn"]


def adapter_files(layout: Layout, directory: Path) -> tuple[Path, Path, str]:
    """The adapter's rules and serving certificate; (config, cert dir, caBundle)."""
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / "adapter.yaml"
    config.write_text(yaml.safe_dump({"rules": [ADAPTER_RULE]}, sort_keys=False))
    dns = f"{SERVICE}.{NAMESPACE}.svc"
    ca = Authority(directory, "adapter-ca")
    ca.issue("serving", dns, hosts=(dns, layout.host_pod_ip), client=False, server=True)
    return config, directory, base64.b64encode(ca.pair.cert.read_bytes()).decode()


def adapter_argv(bin_dir: Path, layout: Layout, config: Path, certs: Path) -> list[str]:
    kc = layout.kubeconfig
    return [str(bin_dir / "prometheus-adapter"), f"--lister-kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
            f"--bind-address={layout.host_pod_ip}", f"--secure-port={ADAPTER_PORT}",
            f"--tls-cert-file={certs / 'serving.crt'}",
            f"--tls-private-key-file={certs / 'serving.key'}",
            f"--prometheus-url=http://{PROMETHEUS_ADDR}/", f"--config={config}",
            "--metrics-relist-interval=10s", "--v=1"]


def objects(layout: Layout, ca_bundle: str) -> list[dict[str, Any]]:
    """The adapter's Service (its EndpointSlice names the adapter's address) and the
    APIServices that hand it custom.metrics.k8s.io (replacing gpuscale's)."""
    meta = {"name": SERVICE, "namespace": NAMESPACE}
    out = host_service(layout, NAMESPACE, SERVICE, ADAPTER_PORT)
    for version, priority in (("v1beta1", 100), ("v1beta2", 200)):
        out.append({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
                    "metadata": {"name": f"{version}.custom.metrics.k8s.io"},
                    "spec": {"service": {**meta, "port": 443},
                             "group": "custom.metrics.k8s.io", "version": version,
                             "caBundle": ca_bundle, "groupPriorityMinimum": 100,
                             "versionPriority": priority}})
    return out
