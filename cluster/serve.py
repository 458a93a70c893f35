"""``python -m cluster serve``: runs inside the cluster's namespace, brings the programs
up in order, records each step in ``state.json`` (the host side reads it to show
progress), then waits for SIGTERM and stops everything it started."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cluster import control_plane, dra, helm, keda, nodes
from cluster.layout import ETCD_PORT, Layout
from cluster.pki import ClusterPki, make_pki
from cluster.supervisor import (
    StartError,
    Supervisor,
    client_context,
    http_ok,
    read_state,
    write_state,
)

REPO = Path(__file__).resolve().parent.parent
STAGES = Path(__file__).resolve().parent / "kwok-stages.yaml"


def step(layout: Layout, text: str, phase: str = "starting") -> None:
    state = read_state(layout)
    state.update({"phase": phase, "step": text, "at": time.time()})
    write_state(layout, state)


def kubectl(bin_dir: Path, layout: Layout, *args: str,
            stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    argv = [str(bin_dir / "kubectl"), f"--kubeconfig={layout.kubeconfig}", *args]
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise StartError(f"kubectl {' '.join(args)}: {done.stderr.strip()[-2000:]}")
    return done


def apply(bin_dir: Path, layout: Layout, objects: Sequence[dict[str, Any]]) -> None:
    body = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)})
    kubectl(bin_dir, layout, "apply", "--server-side", "--force-conflicts",
            "--field-manager=gpuscale-cluster", "-f", "-", stdin=body)


def api_ready(bin_dir: Path, layout: Layout, path: str) -> bool:
    argv = [str(bin_dir / "kubectl"), f"--kubeconfig={layout.kubeconfig}", "get", "--raw", path]
    return subprocess.run(argv, capture_output=True, check=False).returncode == 0


def control_plane_up(sup: Supervisor, bin_dir: Path, pki: ClusterPki) -> None:
    layout = sup.layout
    step(layout, "etcd")
    sup.start("etcd", control_plane.etcd(bin_dir, layout))
    sup.wait_until("etcd", http_ok(f"http://127.0.0.1:{ETCD_PORT}/health"))
    step(layout, "kube-apiserver")
    sup.start("kube-apiserver", control_plane.apiserver(bin_dir, layout, pki))
    ctx = client_context(pki.ca.cert, pki.admin.cert, pki.admin.key)
    sup.wait_until("kube-apiserver",
                   http_ok(f"{layout.server}/readyz", ctx), timeout=180)
    step(layout, "kube-controller-manager, kube-scheduler")
    sup.start("kube-controller-manager", control_plane.controller_manager(bin_dir, layout, pki))
    sup.start("kube-scheduler", control_plane.scheduler(bin_dir, layout))
    sup.wait_until("kube-scheduler", lambda: api_ready(
        bin_dir, layout, "/api/v1/namespaces/default/serviceaccounts/default"), timeout=120)


def nodes_up(sup: Supervisor, bin_dir: Path) -> None:
    layout = sup.layout
    step(layout, "kwok and the simulated GPU nodes")
    apply(bin_dir, layout, nodes.node_objects(layout))
    # The fake DRA driver: its DeviceClass and the DRA nodes' ResourceSlices.
    apply(bin_dir, layout, dra.driver_objects(nodes.DEFAULT_NODES))
    sup.start("kwok", nodes.kwok_argv(str(bin_dir), layout, str(STAGES)))
    sup.wait_until("kwok", lambda: _nodes_ready(bin_dir, layout), timeout=120)


def _nodes_ready(bin_dir: Path, layout: Layout) -> bool:
    out = subprocess.run([str(bin_dir / "kubectl"), f"--kubeconfig={layout.kubeconfig}", "get",
                          "nodes", "-o",
                          "jsonpath={.items[*].status.conditions[?(@.type=='Ready')].status}"],
                         capture_output=True, text=True, check=False).stdout.split()
    return len(out) == len(nodes.DEFAULT_NODES) and all(s == "True" for s in out)


def keda_up(sup: Supervisor, bin_dir: Path) -> None:
    layout = sup.layout
    step(layout, "KEDA: CRDs, operator, metrics apiserver")
    crds = keda.module_dir(REPO / "cluster" / "go" / "keda") / "config" / "crd"
    kubectl(bin_dir, layout, "apply", "--server-side", "-k", str(crds))
    cert_dir = keda.certs(layout)
    apply(bin_dir, layout, keda.objects(layout, cert_dir))
    sup.start("keda-operator", keda.operator_argv(bin_dir, layout, cert_dir), env=keda.env())
    sup.wait_until("keda-operator", http_ok("http://127.0.0.1:8081/readyz"))
    sup.start("keda-adapter", keda.adapter_argv(bin_dir, layout, cert_dir), env=keda.env())
    sup.wait_until("keda-adapter", lambda: api_ready(
        bin_dir, layout, "/apis/external.metrics.k8s.io/v1beta1"), timeout=120)


PROMETHEUS_CRDS = ("servicemonitors", "podmonitors", "prometheusrules")


def gpuscale_up(sup: Supervisor, bin_dir: Path) -> None:
    """gpuscale as a user installs it (the Helm chart, applied to the real API server,
    with its custom metrics API), and the stand-in kubelet that runs its pods."""
    layout = sup.layout
    step(layout, "gpuscale: the Helm chart, and the pods' stand-in kubelet")
    crd_dir = keda.module_dir(REPO / "cluster" / "go" / "prometheus-operator",
                              "github.com/prometheus-operator/prometheus-operator")
    for name in PROMETHEUS_CRDS:
        path = crd_dir / "example" / "prometheus-operator-crd"
        kubectl(bin_dir, layout, "apply", "--server-side", "-f",
                str(path / f"monitoring.coreos.com_{name}.yaml"))
    kubectl(bin_dir, layout, "wait", "--for=condition=Established", "--timeout=60s",
            *(f"crd/{n}.monitoring.coreos.com" for n in PROMETHEUS_CRDS))
    apply(bin_dir, layout, helm.objects(layout.pki / "metrics-api"))
    sup.start("pods", [sys.executable, "-m", "cluster.pods", f"--root={layout.root}",
                       f"--slot={layout.slot}", f"--bin={bin_dir}"])
    sup.wait_until("pods", lambda: api_ready(
        bin_dir, layout, "/apis/custom.metrics.k8s.io/v1beta2"), timeout=120)


SAMPLE = REPO / "deploy" / "examples" / "vllm.yaml"


def sample_up(sup: Supervisor, bin_dir: Path) -> None:
    """deploy/examples/vllm.yaml as it is: a vLLM Deployment and its ScaledObject, for a
    newcomer to watch (``./dev cluster load llm/vllm-llama N`` moves it)."""
    step(sup.layout, "the sample workload (deploy/examples/vllm.yaml)")
    apply(bin_dir, sup.layout, [{"apiVersion": "v1", "kind": "Namespace",
                                 "metadata": {"name": "llm"}}])
    kubectl(bin_dir, sup.layout, "apply", "--server-side", "-f", str(SAMPLE))


def serve(layout: Layout, bin_dir: Path, sample: bool = True) -> int:
    """Brings the cluster up and holds it until SIGTERM; 1 when the start failed."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    sup = Supervisor(layout)
    try:
        pki = make_pki(layout.pki, (layout.ns_ip, "127.0.0.1"))
        control_plane.write_kubeconfig(layout, pki)
        control_plane_up(sup, bin_dir, pki)
        nodes_up(sup, bin_dir)
        gpuscale_up(sup, bin_dir)
        keda_up(sup, bin_dir)
        if sample:
            sample_up(sup, bin_dir)
        step(layout, "ready", phase="ready")
        while not stop.wait(1.0):
            if gone := sup.exited():
                step(layout, f"exited: {', '.join(gone)}", phase="degraded")
    except (StartError, OSError, subprocess.SubprocessError) as e:
        step(layout, str(e), phase="failed")
        sup.stop_all()
        return 1
    step(layout, "stopping", phase="stopping")
    sup.stop_all()
    step(layout, "stopped", phase="stopped")
    return 0
