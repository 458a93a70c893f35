"""Where one cluster keeps its state and which addresses it uses.

The cluster lives in a network namespace of its own. Inside it, ``lo`` answers for every
address of the pod range (a ``local`` route), so a process standing in for a pod binds its
pod's IP; the host reaches the namespace through one veth pair. The addresses come from
198.18.0.0/15, the range RFC 2544 sets aside for benchmarking networks: never routed
beyond a test bench, so they cannot shadow a real network the machine is on.
Pod IPs cannot be loopback addresses: the API server refuses 127.0.0.0/8 in EndpointSlices.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

APISERVER_PORT = 6443
ETCD_PORT = 2379
ETCD_PEER_PORT = 2380
KEDA_ADAPTER_PORT = 6444
KEDA_GRPC_PORT = 9666
SLOTS = 4
SERVICE_RANGE = "10.96.0.0/16"  # ClusterIPs: allocated, never routed (no kube-proxy)


@dataclass(frozen=True, slots=True)
class Layout:
    """One cluster: ``slot`` 0 is ``./dev cluster``'s, others are the test suite's."""

    root: Path  # the state directory (``.cluster`` for ./dev cluster)
    slot: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.slot < SLOTS:  # each slot's pod range is a /18 of 198.19.0.0/16
            raise ValueError(f"cluster slot {self.slot}: 0..{SLOTS - 1} (0 is ./dev cluster's)")

    @property
    def netns(self) -> str:
        return f"gpuscale-cluster{self.slot}"

    @property
    def host_veth(self) -> str:
        return f"gsc{self.slot}h"

    @property
    def host_ip(self) -> str:
        return f"198.18.{self.slot}.1"

    @property
    def ns_ip(self) -> str:
        """The namespace's own address: the API server, as the host and the pods see it."""
        return f"198.18.{self.slot}.2"

    @property
    def pod_range(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(f"198.19.{self.slot * 64}.0/18")

    def pod_cidr(self, node_index: int) -> str:
        """The podCIDR of the ``node_index``-th simulated node: one /24 of the pod range."""
        if not 0 <= node_index < 62:  # 62: host_pod_ip's; 63: kwok's fallback range
            raise ValueError(f"node index {node_index} out of 0..61")
        return f"198.19.{self.slot * 64 + node_index}.0/24"

    @property
    def host_pod_ip(self) -> str:
        """An address in the pod range for programs that are no pod but must be reached
        as one (KEDA's metrics apiserver, behind a Service whose EndpointSlice names it:
        with aggregator routing the API server dials endpoints, never an ExternalName)."""
        return f"198.19.{self.slot * 64 + 62}.1"

    @property
    def server(self) -> str:
        return f"https://{self.ns_ip}:{APISERVER_PORT}"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd"


def host_service(layout: Layout, namespace: str, name: str, port: int) -> list[dict[str, Any]]:
    """The namespace, and a Service on 443 without selector whose EndpointSlice names
    ``layout.host_pod_ip:port``: how an aggregated API server that runs as no pod (KEDA's
    metrics apiserver, prometheus-adapter) is reached; with aggregator routing the API
    server dials endpoints and refuses an ExternalName Service."""
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": namespace},
         "spec": {"ports": [{"name": "https", "port": 443, "targetPort": port}]}},
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": f"{name}-host", "namespace": namespace,
                      "labels": {"kubernetes.io/service-name": name,
                                 "endpointslice.kubernetes.io/managed-by": "gpuscale-cluster"}},
         "addressType": "IPv4",
         "endpoints": [{"addresses": [layout.host_pod_ip], "conditions": {"ready": True}}],
         "ports": [{"name": "https", "port": port, "protocol": "TCP"}]},
    ]
