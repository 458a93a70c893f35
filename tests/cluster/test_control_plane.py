"""The cluster itself: the real programs, their versions, the aggregation layer, the
simulated GPU nodes, and gpuscale deployed from its own kustomize base."""

from __future__ import annotations

import ipaddress
import subprocess
from pathlib import Path

import pytest

from cluster.session import Cluster
from tests.support.polling import until_sync

pytestmark = pytest.mark.cluster

PROGRAMS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok",
            "keda-operator", "keda-adapter")


def test_every_program_is_the_real_one_built_from_its_module(cluster: Cluster) -> None:
    pids = subprocess.run(["ip", "netns", "pids", cluster.layout.netns], capture_output=True,
                          text=True, check=True).stdout.split()
    running = {Path(Path(f"/proc/{p}/exe").resolve()).name for p in pids
               if Path(f"/proc/{p}").exists()}
    assert set(PROGRAMS) <= running, f"missing: {set(PROGRAMS) - running}"
    info = cluster.kubectl("get", "--raw", "/version")
    assert '"gitVersion": "v1.37.2"' in info


def test_gpu_nodes_advertise_what_a_device_plugin_would(cluster: Cluster) -> None:
    nodes = {n["metadata"]["name"]: n for n in cluster.get("nodes")["items"]}
    assert nodes["kwok-gpu-0"]["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert nodes["kwok-mig-0"]["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] == "14"
    assert nodes["kwok-ts-0"]["status"]["allocatable"]["nvidia.com/gpu"] == "16"
    assert nodes["kwok-amd-0"]["status"]["allocatable"]["amd.com/gpu"] == "8"
    ready = {name: [c["status"] for c in n["status"]["conditions"] if c["type"] == "Ready"]
             for name, n in nodes.items()}
    assert all(v == ["True"] for v in ready.values()), ready


def test_external_metrics_answer_through_the_real_aggregator(cluster: Cluster) -> None:
    out = cluster.kubectl("get", "--raw", "/apis/external.metrics.k8s.io/v1beta1")
    assert '"groupVersion":"external.metrics.k8s.io/v1beta1"' in out


def test_agents_are_discovered_through_real_endpointslices(cluster: Cluster) -> None:
    """The DaemonSet's pods land on the NVIDIA nodes, get pod IPs from their nodes'
    podCIDRs, and the real EndpointSlice controller publishes them ready."""
    def ready_agents() -> list[str]:
        slices = cluster.get("endpointslices", "-n", "gpuscale", "-l",
                             "kubernetes.io/service-name=gpuscale-agent")["items"]
        return [ep["addresses"][0] for s in slices for ep in s.get("endpoints") or []
                if ep.get("conditions", {}).get("ready")]
    agents = until_sync(lambda: len(ready_agents()) >= 4 and ready_agents(), within=120,
                        what="four ready agents in the EndpointSlices")
    for ip in agents:
        assert ipaddress.ip_address(ip) in cluster.layout.pod_range
