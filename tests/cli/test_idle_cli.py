"""``gpuscale idle`` against real scaler processes: a demo scenario whose history records
every half second, a scaler with no agents, and no scaler at all."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.polling import until_sync
from tests.support.ports import free_port
from tests.support.processes import HistoryDemo, Proc

GPUSCALE = [sys.executable, "-m", "gpuscale.cli"]
H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"


def idle(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*GPUSCALE, "idle", *args], capture_output=True, text=True,
                          timeout=60, check=False)


def report(address: str, *args: str) -> dict[str, Any]:
    out = idle("--scaler", address, "--json", *args)
    assert out.returncode == 0, out.stderr
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


@pytest.fixture(scope="module")
def mig_demo() -> Iterator[HistoryDemo]:
    demo = HistoryDemo("mig-node")
    try:
        # Every held device has a minute on record, the H100 instances with readings.
        until_sync(lambda: len(report(demo.address, "--threshold", "100", "--idle-for", "1s")
                               ["idle_now"]) == 4, 30.0, "four measured MIG instances")
        yield demo
    finally:
        demo.stop()


def test_json_counts_mig_instances_as_their_fraction(mig_demo: HistoryDemo) -> None:
    # Under 100 % for a second: every measured, allocated device is "idle now", which
    # lists each with its fraction.
    doc = report(mig_demo.address, "--threshold", "100", "--idle-for", "1s", "--price",
                 f"{H100}=3.00")
    fractions = {(i["pods"][0], i["model"]): i["fraction"] for i in doc["idle_now"]}
    assert fractions == pytest.approx({
        ("llm/triton-embed-0", f"{H100} 3g.40gb"): 40192 / 81559,
        ("llm/tgi-small-0", f"{H100} 2g.20gb"): 19968 / 81559,
        ("batch/ocr-worker-0", f"{H100} 1g.10gb"): 9984 / 81559,
        ("llm/triton-embed-1", f"{H100} 3g.40gb"): 40192 / 81559}, rel=1e-3)
    # The A100's instances have no utilization reading (Ampere): never idle, never used.
    assert not [i for i in doc["idle_now"] if A100 in i["model"]]
    ns = {n["namespace"]: n for n in doc["namespaces"]}
    assert set(ns) == {"llm", "batch"}
    # batch: one H100 1g.10gb measured, two A100 1g.10gb instances not.
    a100_1g = 9728 / 81920
    expected = (9984 / 81559) / (9984 / 81559 + 2 * a100_1g)
    assert ns["batch"]["coverage"] == pytest.approx(expected, rel=0.05)
    assert ns["llm"]["coverage"] == pytest.approx(1.0)
    # llm holds 3g + 2g + 3g of an H100 the whole time: GPU-hours per elapsed hour ~1.23.
    assert ns["llm"]["gpu_hours_allocated"] > 0
    assert doc["unpriced_models"] == [f"{A100} 1g.10gb"]
    assert ns["llm"]["cost_allocated"] == pytest.approx(3.0 * ns["llm"]["gpu_hours_allocated"])
    assert ns["batch"]["unpriced_gpu_hours"] > 0
    workloads = {(w["namespace"], w["workload"]) for w in doc["workloads"]}
    assert workloads == {("llm", "Deployment/triton-embed"), ("llm", "Deployment/tgi-small"),
                         ("batch", "Deployment/ocr-worker")}


def test_table_and_csv(mig_demo: HistoryDemo, tmp_path: Any) -> None:
    prices = tmp_path / "prices.yaml"
    prices.write_text(f"{H100}: 3.0\n{A100}: 1.6\n")
    out = idle("--scaler", mig_demo.address, "--prices", str(prices), "--window", "5m")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"GPU use from the scaler at {mig_demo.address}")
    for word in ("NAMESPACE", "Deployment/triton-embed", "TOTAL", "IDLE NOW"):
        assert word in out.stdout
    assert "?" not in out.stdout  # every model priced
    out = idle("--scaler", mig_demo.address, "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(out.stdout)))
    assert {r["kind"] for r in rows} == {"namespace", "workload", "total"}
    assert [r["cost_allocated"] for r in rows] == [""] * len(rows)  # no prices: unknown


def test_namespace_filter(mig_demo: HistoryDemo) -> None:
    doc = report(mig_demo.address, "--namespace", "llm")
    assert [n["namespace"] for n in doc["namespaces"]] == ["llm"]
    assert {w["namespace"] for w in doc["workloads"]} == {"llm"}
    whole = report(mig_demo.address)
    assert doc["total"]["gpu_hours_allocated"] < whole["total"]["gpu_hours_allocated"]
    none = idle("--scaler", mig_demo.address, "--namespace", "nothere")
    assert none.returncode == 0
    assert "no GPU data for this window" in none.stderr


def test_bad_input_is_exit_2(mig_demo: HistoryDemo) -> None:
    for args, says in ((["--price", "H100"], "not MODEL=PRICE"),
                       (["--window", "soon"], "not a duration"),
                       (["--namespace", "Bad/ns"], "not a Kubernetes namespace"),
                       (["--threshold", "150"], "0 to 100"),
                       (["--prices", "/nonexistent.yaml"], "cannot read")):
        out = idle("--scaler", mig_demo.address, *args)
        assert (out.returncode, out.stdout) == (2, ""), args
        assert says in out.stderr
        assert "Traceback" not in out.stderr


def test_scaler_down_is_a_message() -> None:
    out = idle("--scaler", f"127.0.0.1:{free_port()}")
    assert out.returncode == 1
    assert "did not answer" in out.stderr
    assert "--scaler HOST:PORT" in out.stderr
    assert "Traceback" not in out.stderr
    assert out.stdout == ""


def test_a_scaler_without_agents_says_it_has_no_data() -> None:
    port = free_port()
    scaler = Proc("scaler", "--host", "127.0.0.1", "--port", str(port), "--metrics-port",
                  str(free_port()), "--agents", f"127.0.0.1:{free_port()}",
                  "--agents-insecure")
    try:
        out = until_sync(lambda: (o := idle("--scaler", f"127.0.0.1:{port}")).returncode == 0
                         and o, 15.0, "the scaler answering")
        assert "has no GPU data for this window" in out.stderr
        assert "TOTAL" in out.stdout
        assert "none" in out.stdout
    finally:
        scaler.stop()


def test_plot_writes_a_png(mig_demo: HistoryDemo, tmp_path: Any) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "idle.png"
    out = idle("--scaler", mig_demo.address, "--plot", str(png), "--json")
    assert out.returncode == 0, out.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Refused before the report is read, not after it is printed (tests/cli/test_output).
    bad = idle("--scaler", mig_demo.address, "--plot", str(tmp_path / "no" / "x.png"))
    assert bad.returncode == 2
    assert "does not exist" in bad.stderr
    assert bad.stdout == ""


def test_the_demos_agent_hint_reads_what_the_scaler_gets(mig_demo: HistoryDemo) -> None:
    """The scenario demo prints each agent's stream; ``gpuscale gpus --agent`` on it shows
    that agent's node: its MIG instances and the pods holding them."""
    (node, stream), = mig_demo.streams.items()
    out = subprocess.run([sys.executable, "-m", "gpuscale.cli", "gpus", "--agent", stream],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"node {node}  (agent {stream}")
    assert any("3g.40gb" in line and "llm/triton-embed-0" in line
               for line in out.stdout.splitlines())
