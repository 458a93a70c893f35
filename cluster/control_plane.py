"""The command lines of the real control plane's programs, and the kubeconfig they share.

Each function returns an argv; ``supervisor`` runs them inside the cluster's namespace.
Flags are the ones kubeadm and kwokctl give these programs, cut to what one loopback
cluster needs; the HPA controller keeps every default of a real cluster (15 s sync,
5-minute downscale stabilization), so what it does here is what it does there."""

from __future__ import annotations

from pathlib import Path

import yaml

from cluster.layout import (
    APISERVER_PORT,
    ETCD_PEER_PORT,
    ETCD_PORT,
    SERVICE_RANGE,
    Layout,
)
from cluster.pki import FRONT_PROXY_CLIENT, ClusterPki


def etcd(bin_dir: Path, layout: Layout) -> list[str]:
    client, peer = f"http://127.0.0.1:{ETCD_PORT}", f"http://127.0.0.1:{ETCD_PEER_PORT}"
    return [str(bin_dir / "etcd"), "--name=gpuscale", f"--data-dir={layout.etcd_data}",
            f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=gpuscale={peer}", "--initial-cluster-state=new",
            "--unsafe-no-fsync",  # a throwaway cluster: no fsync per write on a small disk
            "--quota-backend-bytes=1073741824", "--log-level=warn"]


def apiserver(bin_dir: Path, layout: Layout, pki: ClusterPki) -> list[str]:
    return [
        str(bin_dir / "kube-apiserver"),
        f"--etcd-servers=http://127.0.0.1:{ETCD_PORT}",
        # The namespace's own address only: a pod may listen on 6443 of its pod IP.
        f"--bind-address={layout.ns_ip}", f"--secure-port={APISERVER_PORT}",
        f"--advertise-address={layout.ns_ip}",
        f"--tls-cert-file={pki.apiserver.cert}", f"--tls-private-key-file={pki.apiserver.key}",
        f"--client-ca-file={pki.ca.cert}",
        f"--service-account-key-file={pki.service_account.cert}",
        f"--service-account-signing-key-file={pki.service_account.key}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-cluster-ip-range={SERVICE_RANGE}",
        "--authorization-mode=Node,RBAC",
        "--allow-privileged=true",
        # The aggregation layer: what the API server presents to aggregated API servers
        # (KEDA's metrics apiserver, gpuscale's custom metrics API) and how they trust it.
        f"--requestheader-client-ca-file={pki.front_proxy_ca.cert}",
        f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={pki.front_proxy_client.cert}",
        f"--proxy-client-key-file={pki.front_proxy_client.key}",
        # Route to an APIService's endpoints (pod IPs, or an ExternalName's host) rather
        # than its ClusterIP: there is no kube-proxy.
        "--enable-aggregator-routing=true",
        "--v=1",
    ]


def controller_manager(bin_dir: Path, layout: Layout, pki: ClusterPki) -> list[str]:
    kc = str(layout.kubeconfig)
    return [
        str(bin_dir / "kube-controller-manager"),
        f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}",
        f"--authorization-kubeconfig={kc}",
        "--bind-address=127.0.0.1", "--secure-port=10257",
        "--leader-elect=false",
        f"--service-account-private-key-file={pki.service_account.key}",
        f"--root-ca-file={pki.ca.cert}",
        f"--cluster-signing-cert-file={pki.ca.cert}",
        f"--cluster-signing-key-file={pki.ca.cert.with_suffix('.key')}",
        "--use-service-account-credentials=true",
        # Node lifecycle: kwok keeps the simulated nodes' leases; a node it stops renewing
        # is marked NotReady and its pods evicted, as with a real kubelet.
        "--controllers=*",
        "--v=1",
    ]


def scheduler(bin_dir: Path, layout: Layout) -> list[str]:
    kc = str(layout.kubeconfig)
    return [str(bin_dir / "kube-scheduler"), f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1", "--secure-port=10259", "--leader-elect=false",
            "--v=1"]


def write_kubeconfig(layout: Layout, pki: ClusterPki) -> Path:
    """The admin kubeconfig (system:masters), for the host and the namespace alike."""
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "gpuscale",
        "clusters": [{"name": "gpuscale", "cluster": {
            "server": layout.server, "certificate-authority": str(pki.ca.cert)}}],
        "users": [{"name": "admin", "user": {
            "client-certificate": str(pki.admin.cert), "client-key": str(pki.admin.key)}}],
        "contexts": [{"name": "gpuscale", "context": {"cluster": "gpuscale", "user": "admin"}}],
    }
    layout.kubeconfig.write_text(yaml.safe_dump(config, sort_keys=False))
    layout.kubeconfig.chmod(0o600)
    return layout.kubeconfig
