"""The metrics API served over real HTTPS for the tests (its ``cluster`` fixture in
conftest.py): the cluster's CAs and client certificates, the RBAC policy the test API
server answers reviews with, GPU pods and their records, and a client (``Cluster``) that
reads as kubectl, as the aggregator's front proxy or over a raw TLS connection."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from yarl import URL

from gpuscale.metrics_api.server import MetricsApiServer
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.stream.records import PodRecord
from tests.peers.kubeapi import KubeApiPeer, make_pod
from tests.support.pki import HPA_USER, issue, make_ca, pem

V1B1 = "/apis/custom.metrics.k8s.io/v1beta1"
V1B2 = "/apis/custom.metrics.k8s.io/v1beta2"


def gpu_pod(name: str, app: str = "vllm", ready: bool = True,
            ns: str = "llm") -> dict[str, Any]:
    pod = make_pod(ns, name, f"uid-{name}", labels={"app": app}, ready=ready)
    pod["spec"]["containers"] = [{"name": "main",
                                  "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    return pod


def record(fleet: FleetView, name: str, app: str = "vllm", ready: bool = True,
           ns: str = "llm", **signals: float) -> PodRecord:
    sig = {k.replace("_", "-"): v for k, v in signals.items()}
    return PodRecord(ns, name, "node-a", {"app": app}, None, ready, sig, fleet.now())


def policy(spec: dict[str, Any]) -> tuple[bool, bool, str]:
    """RBAC as the seed guides grant it: the HPA controller and alice read metrics;
    mallory is denied by name; everyone may read discovery."""
    if "nonResourceAttributes" in spec:
        return True, False, "RBAC: allowed by ClusterRoleBinding \"system:discovery\""
    attrs = spec["resourceAttributes"]
    if spec["user"] == "mallory":
        return False, True, "mallory is banned"
    if spec["user"] in (HPA_USER, "alice") and attrs.get("group") == "custom.metrics.k8s.io":
        return True, False, "RBAC: allowed by ClusterRoleBinding \"hpa-metrics\""
    return False, False, ""


@dataclass
class Cluster:
    server: MetricsApiServer
    peer: KubeApiPeer
    fleet: FleetView
    dir: Path
    url: str

    def client_ssl(self, who: str) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.dir / "serving-ca.crt"))
        if who:
            ctx.load_cert_chain(self.dir / f"{who}.crt", self.dir / f"{who}.key")
        return ctx

    async def connect(self, who: str = "hpa"
                      ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A raw TLS connection to the server (as ``who``; "" no client certificate)."""
        port = int(self.url.rsplit(":", 1)[1])
        return await asyncio.open_connection("127.0.0.1", port, ssl=self.client_ssl(who))

    async def get(self, path: str, who: str = "hpa", headers: dict[str, str] | None = None,
                  method: str = "GET") -> tuple[int, dict[str, Any]]:
        async with aiohttp.ClientSession() as s, s.request(
                method, URL(self.url + path, encoded=True), ssl=self.client_ssl(who),
                headers=headers or {}) as r:
            return r.status, await r.json(content_type=None)

    def kubectl(self, path: str) -> tuple[int, str]:
        p = subprocess.run(["kubectl", "--kubeconfig", str(self.dir / "kubeconfig"),
                            "get", "--raw", path], capture_output=True, text=True,
                           timeout=60, check=False)
        return p.returncode, p.stdout if p.returncode == 0 else p.stderr


def write_certs(d: Path) -> dict[str, str]:
    """The cluster's CAs, a serving certificate, and the clients' certificates; returns
    the trust ConfigMap's data."""
    cluster_ca, proxy_ca, serving_ca = (make_ca("kubernetes"), make_ca("front-proxy-ca"),
                                        make_ca("gpuscale-metrics-ca"))
    (d / "serving-ca.crt").write_bytes(pem(serving_ca[0]))
    leaves = {
        "serving": issue(serving_ca, "gpuscale-metrics", "localhost"),
        "hpa": issue(cluster_ca, HPA_USER, client=True, orgs=("system:serviceaccounts",)),
        "mallory": issue(cluster_ca, "mallory", client=True),
        "bob": issue(cluster_ca, "bob", client=True),
        "proxy": issue(proxy_ca, "front-proxy-client", client=True),
        "other-proxy": issue(proxy_ca, "someone-else", client=True),
        "expired": issue(cluster_ca, HPA_USER, client=True, valid_days=-1),
        "stranger": issue(make_ca("kubernetes"), HPA_USER, client=True),  # same CA name
    }
    for name, (crt, key) in leaves.items():
        (d / f"{name}.crt").write_bytes(crt)
        (d / f"{name}.key").write_bytes(key)
    return {
        "client-ca-file": pem(cluster_ca[0]).decode(),
        "requestheader-client-ca-file": pem(proxy_ca[0]).decode(),
        "requestheader-allowed-names": '["front-proxy-client"]',
        "requestheader-username-headers": '["X-Remote-User"]',
        "requestheader-group-headers": '["X-Remote-Group"]',
        "requestheader-extra-headers-prefix": '["X-Remote-Extra-"]',
    }
