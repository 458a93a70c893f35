"""The metrics API in a real scaler process: agents as processes, the test API server for
the pods, the trust ConfigMap and the reviews, and kubectl as the client."""

from __future__ import annotations

import asyncio
import json
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from gpuscale.metrics_api.quantity import parse_quantity
from tests.peers.kubeapi import DEPLOYMENTS, KubeApiPeer, make_pod, make_workload
from tests.support.kubeconfig import write_kubeconfig
from tests.support.pki import HPA_USER, issue, make_ca, pem
from tests.support.polling import until
from tests.support.ports import free_port
from tests.support.processes import Proc

pytestmark = pytest.mark.slow

SCENARIO = """
nodes:
""" + "".join(f"""
  - name: node-{n}
    gpus: [{{model: L4, count: 1}}]
    processes:
      - {{gpu: 0, memory_mib: 8000, load: {{constant: {load}}},
         pod: {{namespace: llm, name: w-{n}, container: c}}}}
""" for n, load in (("a", 30), ("b", 50)))


def kubectl(kubeconfig: Path, path: str) -> tuple[int, Any]:
    p = subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig), "get", "--raw", path],
                       capture_output=True, text=True, timeout=60, check=False)
    if p.returncode == 0:
        return 0, json.loads(p.stdout)
    return p.returncode, p.stderr


def allow_hpa(spec: dict[str, Any]) -> tuple[bool, bool, str]:
    return spec.get("user") == HPA_USER, False, ""


async def test_a_plain_hpa_reads_the_fleet_from_a_scaler_process(
        tmp_path: Path, kubeapi: KubeApiPeer) -> None:
    cluster_ca, proxy_ca, serving_ca = (make_ca("kubernetes"), make_ca("front-proxy-ca"),
                                        make_ca("gpuscale-metrics-ca"))
    for name, (crt, key) in {"serving": issue(serving_ca, "gpuscale-metrics-api"),
                             "hpa": issue(cluster_ca, HPA_USER, client=True)}.items():
        (tmp_path / f"{name}.crt").write_bytes(crt)
        (tmp_path / f"{name}.key").write_bytes(key)
    (tmp_path / "serving-ca.crt").write_bytes(pem(serving_ca[0]))
    kubeapi.set_configmap("kube-system", "extension-apiserver-authentication", {
        "client-ca-file": pem(cluster_ca[0]).decode(),
        "requestheader-client-ca-file": pem(proxy_ca[0]).decode(),
        "requestheader-username-headers": '["X-Remote-User"]'})
    kubeapi.authorize = allow_hpa
    for n in "ab":
        pod = make_pod("llm", f"w-{n}", f"uid-w-{n}", node=f"node-{n}", labels={"app": "w"})
        pod["spec"]["containers"] = [{"name": "c",
                                      "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
        kubeapi.add(pod)
    kubeapi.add(make_workload("Deployment", "llm", "w", {"app": "w"}), DEPLOYMENTS)
    write_kubeconfig(tmp_path / "scaler-kubeconfig", f"http://127.0.0.1:{kubeapi.port}",
                     {"token": kubeapi.token})
    scenario = tmp_path / "fleet.yaml"
    scenario.write_text(SCENARIO)
    streams = {n: free_port() for n in "ab"}
    procs = [Proc("agent", "--gpu-backend", "sim", "--scenario", str(scenario), "--node",
                  f"node-{n}", "--host", "127.0.0.1", "--port", "0", "--stream-port",
                  str(streams[n]), "--interval", "0.5", "--hostname", f"node-{n}",
                  "--stream-insecure") for n in "ab"]
    # The scaler's ports are picked once the agents have bound theirs: an agent's
    # "--port 0" could otherwise be given a port picked (free, not yet bound) for the
    # scaler, which then cannot start (seen once in a fresh clone's suite).
    api_port, metrics_port = free_port(), free_port()
    hpa = write_kubeconfig(tmp_path / "hpa-kubeconfig", f"https://127.0.0.1:{api_port}",
                           {"client-certificate": str(tmp_path / "hpa.crt"),
                            "client-key": str(tmp_path / "hpa.key")},
                           tmp_path / "serving-ca.crt")
    try:
        procs.append(Proc(
            "scaler", "--host", "127.0.0.1", "--port", str(free_port()), "--metrics-port",
            str(metrics_port), "--agents-insecure",
            "--agents", ",".join(f"127.0.0.1:{p}" for p in streams.values()),
            "--kubeconfig", str(tmp_path / "scaler-kubeconfig"),
            "--metrics-api-port", str(api_port),
            "--metrics-api-cert", str(tmp_path / "serving.crt"),
            "--metrics-api-key", str(tmp_path / "serving.key")))
        pods = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/llm/pods/*/gpu_utilization" \
               "?labelSelector=app%3Dw"
        workload = "/apis/custom.metrics.k8s.io/v1beta1/namespaces/llm/deployments.apps/w/" \
                   "gpuscale_gpu_utilization"

        async def both_pods() -> bool:
            code, body = await asyncio.to_thread(kubectl, hpa, pods)
            return code == 0 and len(body["items"]) == 2

        await until(both_pods, within=30, what="both agents' pods served")
        code, body = await asyncio.to_thread(kubectl, hpa, workload)
        assert code == 0, body
        assert body["items"][0]["metricName"] == "gpuscale_gpu_utilization"
        total = float(parse_quantity(body["items"][0]["value"]))
        assert 70 <= total <= 90  # 30 % + 50 % of one GPU each, simulated with noise

        procs[1].stop()  # node-b's agent dies: w-b is Ready and running, with no data

        async def refused() -> bool:
            code, out = await asyncio.to_thread(kubectl, hpa, pods)
            return code != 0 and "w-b" in str(out)

        await until(refused, within=30, what="the API refused the partial list")
        code, out = await asyncio.to_thread(kubectl, hpa, workload)
        assert code != 0
        assert "w-b" in out
        exposed = await asyncio.to_thread(lambda: urllib.request.urlopen(
            f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode())
        assert 'gpuscale_metrics_api_requests_total{code="200"}' in exposed
        assert 'gpuscale_metrics_api_requests_total{code="503"}' in exposed
    finally:
        for p in procs:
            p.stop()
