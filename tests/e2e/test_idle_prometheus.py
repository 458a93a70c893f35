"""``gpuscale idle --prometheus``: a real Prometheus scrapes a demo's real agent (and a
stand-in for kube-state-metrics), and the report it gives matches the one from the same
demo's scaler over the same minutes."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import yaml

from tests.e2e.test_prometheus import _binary
from tests.support.polling import until_sync
from tests.support.ports import free_port
from tests.support.processes import HistoryDemo

pytestmark = pytest.mark.slow

# Constant loads: the two paths sample at different moments, and a constant is the same
# whichever moment. A whole GPU, an idle one, a time-sliced GPU shared by two namespaces,
# and a MIG GPU with a busy and an idle instance.
SCENARIO = """
nodes:
  - name: idle-node
    gpus:
      - {model: L4, count: 3}
      - {model: L4, sharing: time-sliced}
      - {model: H100-SXM5-80GB, sharing: mig, mig: [3g.40gb, 1g.10gb]}
    processes:
      - {gpu: 0, pid: 100, memory_mib: 9000, load: {constant: 60},
         pod: {namespace: llm, name: vllm-0, container: vllm}}
      - {gpu: 1, pid: 101, memory_mib: 1000, load: {constant: 2},
         pod: {namespace: notebooks, name: jupyter-0, container: nb}}
      - {gpu: 3, pid: 102, memory_mib: 3000, load: {constant: 20},
         pod: {namespace: dev, name: ts-a, container: app}}
      - {gpu: 3, pid: 103, memory_mib: 3000, load: {constant: 30},
         pod: {namespace: llm, name: ts-b, container: app}}
      - {gpu: 4, mig: 0, memory: 0.5, load: {constant: 50},
         pod: {namespace: llm, name: embed-0, container: e}}
      - {gpu: 4, mig: 1, memory: 0.5, load: {constant: 5},
         pod: {namespace: batch, name: ocr-0, container: w}}
"""
PODS = [("llm", "vllm-0"), ("notebooks", "jupyter-0"), ("dev", "ts-a"), ("llm", "ts-b"),
        ("llm", "embed-0"), ("batch", "ocr-0")]
# What kube-state-metrics says: each pod's ReplicaSet, each ReplicaSet's Deployment (named
# as the demo names its pods' owners).
KSM = "".join(
    f'kube_pod_owner{{namespace="{ns}",pod="{pod}",owner_kind="ReplicaSet",'
    f'owner_name="{pod.rsplit("-", 1)[0]}-5d9f",owner_is_controller="true"}} 1\n'
    f'kube_replicaset_owner{{namespace="{ns}",replicaset="{pod.rsplit("-", 1)[0]}-5d9f",'
    f'owner_kind="Deployment",owner_name="{pod.rsplit("-", 1)[0]}"}} 1\n'
    for ns, pod in PODS).encode()
# Allocation: both paths count each bucket's time inside the window, so they differ only
# by the second or so between the two reads. Use: utilization sampled at different moments
# (every 0.5 s into the scaler's minutes, every 1 s by Prometheus).
ALLOCATED_TOLERANCE = 0.03
USED_TOLERANCE = 0.05


class _Ksm(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(KSM)

    def log_message(self, *_: Any) -> None:
        pass


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[HistoryDemo, str]]:
    tmp = tmp_path_factory.mktemp("idle-prom")
    (tmp / "scenario.yaml").write_text(SCENARIO)
    demo = HistoryDemo(str(tmp / "scenario.yaml"))
    ksm = ThreadingHTTPServer(("127.0.0.1", 0), _Ksm)
    threading.Thread(target=ksm.serve_forever, daemon=True).start()
    agent = urllib.parse.urlsplit(demo.metrics["idle-node"]).netloc
    config = {"global": {"scrape_interval": "1s"}, "scrape_configs": [
        {"job_name": "gpuscale-agent", "static_configs": [{"targets": [agent]}]},
        {"job_name": "kube-state-metrics",
         "static_configs": [{"targets": [f"127.0.0.1:{ksm.server_address[1]}"]}]}]}
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    server = subprocess.Popen(
        [_binary("prometheus"), f"--config.file={tmp / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=(tmp / "prometheus.log").open("w"))
    try:
        yield demo, f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(10)
        ksm.shutdown()
        demo.stop()


def idle_json(*args: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "gpuscale.cli", "idle", "--json", *args],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


def test_prometheus_and_the_scaler_agree(setup: tuple[HistoryDemo, str]) -> None:
    demo, prom = setup

    def scraped() -> bool:
        q = urllib.parse.quote("count(DCGM_FI_DEV_FB_USED{pod!=''}) + count(kube_pod_owner)")
        result = _get(f"{prom}/api/v1/query?query={q}")["data"]["result"]
        return bool(result) and float(result[0]["value"][1]) == 6 + 6

    until_sync(scraped, 45.0, "Prometheus scraping the agent", every=0.5,
               tolerate=(OSError,))
    ready = time.time()
    # The window is data both sides hold: from after Prometheus's first scrape to now.
    time.sleep(20)  # not a synchronisation: the window being filled
    window = f"{int(time.time() - ready - 2)}s"
    common = ("--window", window, "--idle-for", "10s", "--price", "NVIDIA L4=0.70,"
              "NVIDIA H100 80GB HBM3=2.50")
    scaler = idle_json("--scaler", demo.address, *common)
    prometheus = idle_json("--prometheus", prom, *common)

    def rows(doc: dict[str, Any], level: str) -> dict[tuple[str, str], dict[str, Any]]:
        return {(r["namespace"], r["workload"] or ""): r for r in doc[level]}

    for level in ("namespaces", "workloads"):
        s, p = rows(scaler, level), rows(prometheus, level)
        assert set(s) == set(p), level
        for key in s:
            for field, tolerance in (("gpu_hours_allocated", ALLOCATED_TOLERANCE),
                                     ("gpu_hours_used", USED_TOLERANCE),
                                     ("cost_allocated", ALLOCATED_TOLERANCE)):
                assert p[key][field] == pytest.approx(s[key][field], rel=tolerance), (
                    level, key, field)
    # The time-sliced GPU is split between its two pods and their namespaces; the MIG
    # instances count as their memory share of the H100, the same from both sources.
    workloads = rows(scaler, "workloads")
    assert workloads[("dev", "Deployment/ts")]["gpu_hours_allocated"] == pytest.approx(
        workloads[("llm", "Deployment/ts")]["gpu_hours_allocated"], rel=1e-6)
    idle = {i["pods"][0]: i for i in scaler["idle_now"]}
    assert set(idle) == {"notebooks/jupyter-0", "batch/ocr-0"}
    prom_idle = {i["pods"][0]: i for i in prometheus["idle_now"]}
    assert set(prom_idle) == set(idle)
    assert prom_idle["batch/ocr-0"]["fraction"] == pytest.approx(
        idle["batch/ocr-0"]["fraction"], rel=1e-3)
