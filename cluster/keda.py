"""KEDA on the cluster: its CRDs from its own module (``config/crd``, kustomized as KEDA
ships them), the operator and the metrics apiserver as processes in the namespace, and
the APIService that routes ``external.metrics.k8s.io`` to the latter through the real
aggregator (an Service whose EndpointSlice names the adapter's address: it is no pod)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path
from typing import Any

from cluster.layout import KEDA_ADAPTER_PORT, KEDA_GRPC_PORT, Layout, host_service
from cluster.pki import keda_certs
from cluster.supervisor import StartError

NAMESPACE = "keda"
SERVICE = "keda-metrics-apiserver"
MODULE = "github.com/kedacore/keda/v2"


def module_dir(wrapper: Path, module: str = MODULE) -> Path:
    """Where the Go module cache holds ``module`` as the wrapper module pins it."""
    # GOPROXY=off: the namespace has no route out; the module must be in the cache.
    out = subprocess.run(["go", "mod", "download", "-json", module], cwd=wrapper,
                         capture_output=True, text=True, check=False,
                         env={**os.environ, "GOPROXY": "off"})
    try:
        found = json.loads(out.stdout).get("Dir", "")
    except ValueError:
        found = ""
    if out.returncode != 0 or not found:
        raise StartError(f"{module} is not in the Go module cache as {wrapper}/go.mod pins "
                         f"it (cluster/build fetches it): "
                         f"{(out.stderr or out.stdout).strip()[-300:]}")
    return Path(found)


def certs(layout: Layout) -> Path:
    return keda_certs(layout.root / "keda-certs",
                      ("localhost", "127.0.0.1", layout.host_pod_ip, f"{SERVICE}.{NAMESPACE}.svc",
                       f"keda-operator.{NAMESPACE}.svc"))


def env() -> dict[str, str]:
    # WATCH_NAMESPACE must be set ("" = every namespace); outside a pod KEDA cannot read
    # its namespace from the service-account files.
    return {"WATCH_NAMESPACE": "", "KEDA_CLUSTER_OBJECT_NAMESPACE": NAMESPACE,
            "POD_NAMESPACE": NAMESPACE}


def operator_argv(bin_dir: Path, layout: Layout, cert_dir: Path) -> list[str]:
    return [str(bin_dir / "keda-operator"), f"--kubeconfig={layout.kubeconfig}",
            f"--cert-dir={cert_dir}", "--metrics-bind-address=127.0.0.1:8080",
            "--health-probe-bind-address=127.0.0.1:8081",
            f"--metrics-service-bind-address=127.0.0.1:{KEDA_GRPC_PORT}",
            "--zap-log-level=info", "--zap-encoder=console"]


def adapter_argv(bin_dir: Path, layout: Layout, cert_dir: Path) -> list[str]:
    kc = layout.kubeconfig
    return [str(bin_dir / "keda-adapter"), f"--kubeconfig={kc}", f"--lister-kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
            f"--bind-address={layout.host_pod_ip}", f"--secure-port={KEDA_ADAPTER_PORT}",
            f"--cert-dir={cert_dir}", f"--tls-cert-file={cert_dir / 'tls.crt'}",
            f"--tls-private-key-file={cert_dir / 'tls.key'}",
            f"--metrics-service-address=localhost:{KEDA_GRPC_PORT}",
            "--port=9022",  # its plain /metrics; the default 8080 is the operator's
            "--v=1"]


def objects(layout: Layout, cert_dir: Path) -> list[dict[str, Any]]:
    """The namespace, the route through the aggregator (a Service without selector whose
    EndpointSlice names the adapter's address), and the RBAC KEDA's manifests give the HPA
    controller to read external metrics."""
    ca = base64.b64encode((cert_dir / "ca.crt").read_bytes()).decode()
    meta = {"name": SERVICE, "namespace": NAMESPACE}
    return [
        *host_service(layout, NAMESPACE, SERVICE, KEDA_ADAPTER_PORT),
        {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
         "metadata": {"name": "v1beta1.external.metrics.k8s.io"},
         "spec": {"service": {**meta, "port": 443},
                  "group": "external.metrics.k8s.io", "version": "v1beta1",
                  "caBundle": ca, "groupPriorityMinimum": 100, "versionPriority": 100}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "keda-external-metrics-reader"},
         "rules": [{"apiGroups": ["external.metrics.k8s.io"], "resources": ["*"],
                    "verbs": ["*"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "keda-hpa-controller-external-metrics"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "keda-external-metrics-reader"},
         "subjects": [{"kind": "ServiceAccount", "name": "horizontal-pod-autoscaler",
                       "namespace": "kube-system"}]},
    ]
