"""A real Prometheus scrapes a real agent process; PromQL checks the series and the rules."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.polling import until_sync
from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus" / "gpuscale-rules.yaml"

pytestmark = pytest.mark.slow

SCENARIO = """
nodes:
  - name: prom-node
    gpus:
      - {model: L4, count: 3}
      - {model: A100-SXM4-80GB, sharing: mig, mig: [3g.40gb]}
    processes:
      - {gpu: 0, memory_mib: 20000, load: {constant: 85}}
      - {gpu: 1, memory_mib: 1000, load: {constant: 2}}
      - {gpu: 3, mig: 0, memory: 0.5, load: {constant: 50}}
"""


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found: ./dev test installs Debian's prometheus package")
    return path


def _until(what: str, fn: Callable[[], Any]) -> Any:
    """Prometheus evaluates every few seconds and refuses connections while starting."""
    return until_sync(fn, 45.0, what, every=0.5, tolerate=(OSError,))


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    prom = _binary("prometheus")
    tmp = tmp_path_factory.mktemp("prom")
    scenario = tmp / "scenario.yaml"
    scenario.write_text(SCENARIO)
    agent = subprocess.Popen(
        [sys.executable, "-m", "gpuscale.cli", "agent", "--gpu-backend", "sim", "--scenario",
         str(scenario), "--host", "127.0.0.1", "--port", "0", "--hostname", "prom-node",
         "--stream-port", "-1",
         "--interval", "0.5"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert agent.stdout is not None
    line = agent.stdout.readline()
    assert "serving metrics at http://" in line, line + (agent.stderr.read() if agent.stderr
                                                         else "")
    agent_port = int(line.split("http://")[1].split("/")[0].rsplit(":", 1)[1])

    # The shipped rules, with the idle alert's 30 minutes shortened for the test.
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == "GpuscaleGpuIdle":
                rule["for"] = "3s"
    (tmp / "rules.yaml").write_text(yaml.safe_dump(rules))
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(tmp / "rules.yaml")],
        "scrape_configs": [{
            "job_name": "gpuscale-agent",
            "static_configs": [{"targets": [f"127.0.0.1:{agent_port}"]}],
            # Stand in for a scrape that renamed a `pod` label: gpu 0's series carry
            # exported_pod, which the shipped recording rule must copy to `pod`.
            "metric_relabel_configs": [{"source_labels": ["gpu"], "regex": "0",
                                        "target_label": "exported_pod",
                                        "replacement": "vllm-0"}],
        }],
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    server = subprocess.Popen(
        [prom, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=(tmp / "prometheus.log").open("w"))
    base = f"http://127.0.0.1:{port}"
    try:
        _until("prometheus ready", lambda: urllib.request.urlopen(f"{base}/-/ready",
                                                                  timeout=2).status == 200)
        yield base
    finally:
        for proc in (server, agent):
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


def query(base: str, promql: str) -> list[dict[str, Any]]:
    data = _get(f"{base}/api/v1/query?query={urllib.parse.quote(promql)}")
    assert data["status"] == "success", data
    result: list[dict[str, Any]] = data["data"]["result"]
    return result


def test_dcgm_series_match_the_scenario(prometheus: str) -> None:
    result = _until("three GPU_UTIL series",
                    lambda: len(query(prometheus, "DCGM_FI_DEV_GPU_UTIL")) == 3
                    and query(prometheus, "DCGM_FI_DEV_GPU_UTIL"))
    by_gpu = {r["metric"]["gpu"]: r for r in result}
    # gpu 3 is in MIG mode: no device utilization series at all (absent, not 0).
    assert set(by_gpu) == {"0", "1", "2"}
    assert float(by_gpu["0"]["value"][1]) == pytest.approx(85.0)
    assert float(by_gpu["1"]["value"][1]) == pytest.approx(2.0)
    assert float(by_gpu["2"]["value"][1]) == 0.0  # a real measurement: no process on it
    labels = by_gpu["1"]["metric"]
    assert labels["modelName"] == "NVIDIA L4"
    assert labels["Hostname"] == "prom-node"
    assert labels["device"] == "nvidia1"
    assert labels["UUID"].startswith("GPU-")
    absent = query(prometheus, 'gpuscale_gpu_reading_absent{gpu="3",reading="utilization"}')
    assert {r["metric"]["reason"] for r in absent} == {"unsupported"}
    mig = query(prometheus, 'DCGM_FI_DEV_FB_USED{gpu="3"}')
    assert [(r["metric"]["GPU_I_PROFILE"], r["metric"]["GPU_I_ID"]) for r in mig] == [
        ("3g.40gb", "1")]
    assert float(mig[0]["value"][1]) == pytest.approx(40192 / 2)


def test_recording_rule_copies_exported_pod(prometheus: str) -> None:
    result = _until("recorded series",
                    lambda: len(query(prometheus, "gpuscale:gpu_utilization:by_pod")) == 3
                    and query(prometheus, "gpuscale:gpu_utilization:by_pod"))
    pods = {r["metric"]["gpu"]: r["metric"].get("pod") for r in result}
    assert pods == {"0": "vllm-0", "1": None, "2": None}


def test_idle_alert_fires_for_idle_gpus_only(prometheus: str) -> None:
    def firing() -> set[str]:
        alerts = _get(f"{prometheus}/api/v1/alerts")["data"]["alerts"]
        return {a["labels"]["gpu"] for a in alerts
                if a["labels"]["alertname"] == "GpuscaleGpuIdle" and a["state"] == "firing"}

    # gpu 1 (2 %) and gpu 2 (0 %) are idle; gpu 0 (85 %) is busy; gpu 3 (MIG) has no
    # utilization series and must not count as idle.
    assert _until("idle alerts firing", lambda: firing() == {"1", "2"} and firing()) == {
        "1", "2"}
    stale = _get(f"{prometheus}/api/v1/alerts")["data"]["alerts"]
    assert not [a for a in stale if a["labels"]["alertname"] == "GpuscaleAgentStale"]


def test_shipped_rules_pass_promtool() -> None:
    out = subprocess.run([_binary("promtool"), "check", "rules", str(RULES)],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 7 rules found" in out.stdout
