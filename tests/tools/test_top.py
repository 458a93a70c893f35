"""``gpuscale top`` against a real scaler process (``gpuscale demo --scenario mig-node``):
the printed tables, the JSON, the filters, the live Textual app driven headless at 80x24,
and a scaler that is down or goes away; the pure view in table cases."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from typing import Any

import grpc
import pytest
from textual.widgets import DataTable, Static

from gpuscale.cli import main
from gpuscale.cli.top import reconnecting
from gpuscale.proto import externalscaler_pb2 as keda_pb
from gpuscale.proto import externalscaler_pb2_grpc as keda_grpc
from gpuscale.proto import inspect_pb2 as pb
from gpuscale.proto import telemetry_pb2 as tpb
from gpuscale.tools import top, top_render
from gpuscale.tools.client import Target
from gpuscale.tools.top_app import TopApp
from tests.support.polling import until
from tests.support.ports import free_port
from tests.support.processes import Served, inspect_fleet

MIG_PODS = {"llm/triton-embed-0", "llm/triton-embed-1", "llm/tgi-small-0",
            "batch/ocr-worker-0", "batch/ocr-worker-1", "batch/ocr-worker-2"}


@pytest.fixture(scope="module")
def scaler(scenario_scaler: Served) -> str:
    """The scenario's scaler, asked by "KEDA" about two ScaledObjects: one it can answer,
    one it cannot (the A100's MIG instances report no utilization)."""
    with grpc.insecure_channel(scenario_scaler.address) as channel:
        stub = keda_grpc.ExternalScalerStub(channel)
        for ns, name, app in (("llm", "triton-embed", "triton-embed"),
                              ("batch", "ocr", "ocr-worker")):
            ref = keda_pb.ScaledObjectRef(namespace=ns, name=name, scalerMetadata={
                "podSelector": f"app={app}", "profile": "gpu-utilization"})
            stub.GetMetricSpec(ref, timeout=5)
            # ocr's answer is UNAVAILABLE; KEDA's asking is what the scaler records.
            with contextlib.suppress(grpc.RpcError):
                stub.GetMetrics(keda_pb.GetMetricsRequest(
                    scaledObjectRef=ref, metricName="gpuscale-gpu-utilization"), timeout=5)
    return scenario_scaler.address


def run_top(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["top", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_once_prints_mig_instances_pods_and_workloads_whole_when_piped(
        scaler: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Printed to a pipe (capsys is not a terminal): for reading and grep, so every value
    is whole, whatever COLUMNS says, and no line is a wrapped piece of another."""
    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = run_top(capsys, "--scaler", scaler, "--once")
    assert code == 0, err
    lines = out.splitlines()
    assert "…" not in out
    assert "nodes" in lines[0]
    assert lines[0].rstrip().endswith("node all")  # the summary is one line, not wrapped
    for header in ("NODE GPU MODEL UTIL MEMORY PODS", "POD NODE GPU UTIL MEM QUEUE",
                   "SCALEDOBJECT SIGNAL VALUE / TARGET PODS PLAN"):
        assert any(" ".join(line.split()) == header for line in lines), header  # not cut
    assert sum("3g.40gb" in line for line in lines) == 2
    assert sum("1g.10gb" in line for line in lines) == 11
    for pod in MIG_PODS:
        assert any(line.startswith(pod) for line in lines), pod
    # The A100's instances have no utilization: "-" with the reason, never 0.
    worker = next(line.split() for line in lines if line.startswith("batch/ocr-worker-1"))
    assert worker[3] == "-"
    assert "- means: unsupported" in out
    triton = next(line for line in lines if line.startswith("llm/triton-embed "))
    assert "gpu-utilization" in triton
    assert "/ 70 %" in triton
    ocr = next(line for line in lines if line.startswith("batch/ocr "))
    assert "UNAVAILABLE" in ocr
    assert "ocr-worker" in ocr  # the reason whole in its row, the pods it names included


def test_once_on_a_terminal_fits_its_width_and_says_what_it_cut(scaler: str) -> None:
    from gpuscale.tools.client import InspectClient

    with InspectClient(Target(scaler)) as client:
        view = top.build(client.fleet())
    out = top_render.once_text(view, 80)
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80
    ocr = next(line for line in lines if line.startswith("batch/ocr "))
    assert "…" in ocr  # a cut cell is marked
    # ... and its whole text is printed below its table, wrapped between words at 80.
    detail = out[out.index("  batch/ocr "):].split("\n\n")[0]
    reason = " ".join(detail.split())
    assert "UNAVAILABLE" in reason
    assert "ocr-worker" in reason


def test_json_is_the_fleet_reply(scaler: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_top(capsys, "--scaler", scaler, "--json")
    assert code == 0, err
    got = json.loads(out)
    devices = [d for n in got["nodes"] for d in n["devices"]]
    assert sum(1 for d in devices if d["parent_uuid"]) == 15
    assert {f"{p['namespace']}/{p['name']}" for p in got["pods"]} == MIG_PODS
    worker = next(p for p in got["pods"] if p["name"] == "ocr-worker-1")
    assert worker["signals"]["gpu-utilization"]["absent"] == "unsupported"
    idle = next(d for d in devices if d["parent_uuid"] and not d["pods"])
    assert idle["utilization"] == {"value": 0.0, "absent": "", "detail": ""}  # a true 0
    assert {w["name"] for w in got["workloads"]} == {"triton-embed", "ocr"}


def test_filters_narrow_like_the_scaler(scaler: str, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run_top(capsys, "--scaler", scaler, "--once", "--namespace", "batch",
                           "--sort", "name")
    assert code == 0
    shown = [line.split()[0] for line in out.splitlines() if line.startswith(("llm/", "batch/"))]
    assert shown == ["batch/ocr-worker-0", "batch/ocr-worker-1", "batch/ocr-worker-2",
                     "batch/ocr"]
    code, out, _ = run_top(capsys, "--scaler", scaler, "--json", "--node", "elsewhere")
    assert code == 0
    assert json.loads(out)["pods"] == []
    assert json.loads(out)["nodes"] == []
    # The live view filters what it read; it must narrow as the scaler does.
    whole = inspect_fleet(scaler)
    from gpuscale.tools.client import InspectClient

    with InspectClient(Target(scaler)) as client:
        for ns, node in (("llm", ""), ("batch", "gpu-node-mig"), ("", "gpu-node-mig"),
                         ("nope", ""), ("", "nope")):
            mine, theirs = top.filtered(whole, ns, node), client.fleet(ns, node)
            assert [p.name for p in mine.pods] == [p.name for p in theirs.pods], (ns, node)
            assert [n.name for n in mine.nodes] == [n.name for n in theirs.nodes], (ns, node)
            assert ([w.name for w in mine.workloads]
                    == [w.name for w in theirs.workloads]), (ns, node)


def test_scaler_down_is_exit_1_and_the_clients_message() -> None:
    address = f"127.0.0.1:{free_port()}"
    for mode in ("--once", "--json"):
        got = subprocess.run([sys.executable, "-m", "gpuscale", "top", "--scaler", address,
                              mode], capture_output=True, text=True, timeout=60,
                             check=False)
        assert got.returncode == 1, got
        assert got.stderr.startswith(f"gpuscale: the scaler at {address} did not answer")
        assert "--scaler HOST:PORT" in got.stderr
        assert "Traceback" not in got.stderr
        assert got.stdout == ""


def rows(app: TopApp, name: str) -> list[list[str]]:
    return app.row_texts(name)


def status(app: TopApp) -> str:
    return str(app.query_one("#status", Static).render())


async def test_live_view_sorts_filters_and_fits_80_columns(scaler: str) -> None:
    fetch, close = reconnecting(Target(scaler))
    app = TopApp(fetch, scaler, interval=0.5)
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await until(lambda: len(rows(app, "pods")) == 6, 10.0, "the pods on screen")
            devices = rows(app, "devices")
            assert devices[0][0] == "gpu-node-mig"
            assert sum(r[1] == "0 3g.40gb" for r in devices) == 1
            assert sum(r[1].endswith("1g.10gb") for r in devices) == 11
            for name in ("devices", "pods", "workloads"):
                table = app.query_one(f"#{name}", DataTable)
                assert table.size.width == 80
                assert table.virtual_size.width <= 80 - 2, name  # no column under the bar

            def util(r: list[str]) -> float:
                return -1.0 if r[3] == "-" else float(r[3].rstrip("%"))

            pods = rows(app, "pods")
            assert [util(r) for r in pods] == sorted((util(r) for r in pods), reverse=True)
            assert [r[3] for r in pods[-2:]] == ["-", "-"]  # absent last, never 0

            await pilot.press("s")
            assert app.sort == "memory"
            mem = [float(r[4].rstrip("G")) for r in rows(app, "pods")]
            assert mem == sorted(mem, reverse=True)
            await pilot.press("s", "s")
            assert app.sort == "name"
            assert [r[0] for r in rows(app, "pods")] == sorted(MIG_PODS)

            await pilot.press("n")
            assert app.namespace == "batch"
            assert {r[0].split("/")[0] for r in rows(app, "pods")} == {"batch"}
            assert [r[0] for r in rows(app, "workloads") if r[0]] == ["batch/ocr"]
            await pilot.press("n", "n")
            assert app.namespace == ""
            assert len(rows(app, "pods")) == 6
            await pilot.press("N")
            assert app.node == "gpu-node-mig"
            assert len(rows(app, "pods")) == 6
            await pilot.press("N")
            assert app.node == ""

            # The highlighted row's absent readings say why.
            pods_table = app.query_one("#pods", DataTable)
            pods_table.focus()
            pods_table.move_cursor(row=[r[0] for r in rows(app, "pods")]
                                   .index("batch/ocr-worker-1"))
            await pilot.pause()
            detail = str(app.query_one("#detail", Static).render())
            assert "gpu-utilization: unsupported" in detail
            await pilot.press("q")
        assert not app.is_running
    finally:
        close()


async def test_live_view_says_when_the_scaler_goes_and_recovers(
        scenario_scaler: Served) -> None:
    address, proc = scenario_scaler.address, scenario_scaler.proc
    fetch, close = reconnecting(Target(address))
    app = TopApp(fetch, address, interval=0.3)
    try:
        async with app.run_test(size=(80, 24)):
            await until(lambda: len(rows(app, "pods")) == 6, 10.0, "the pods on screen")
            proc.stop()
            await until(lambda: "did not answer" in status(app), 10.0, "the message")
            assert status(app).startswith(f"{address}: no answer, retrying every 0.3 s")
            assert len(rows(app, "pods")) == 6  # the last data stays, marked by the status
            assert app.is_running
            await asyncio.to_thread(proc.start)  # the same port
            await until(lambda: not app.error and "6 pods" in status(app), 15.0,
                        "the view back")
    finally:
        close()
        if proc.p.poll() is not None:  # leave the module's scaler as it was found
            proc.start()


# -- the pure view ------------------------------------------------------------------------


def reading(value: float = 0.0, absent: str = "", detail: str = "") -> tpb.Reading:
    return tpb.Reading(value=value, absent=absent, detail=detail)


def one_pod(**signals: tpb.Reading) -> pb.Pod:
    return pb.Pod(namespace="ns", name="p", node="n1", ready=True, age=1.0, stale_after=3.0,
                  signals=signals)


def cells(view: top.View, table: str) -> list[list[str]]:
    t = getattr(view, table)
    return [[c.text for c in r.cells] for r in t.rows]


@pytest.mark.parametrize(("signals", "util", "queue", "note"), [
    ({"gpu-utilization": reading(0.0)}, "0%", "", ""),
    ({"gpu-utilization": reading(absent="stale", detail="agent quiet 9 s")}, "-", "",
     "ns/p gpu-utilization: stale (agent quiet 9 s)"),
    ({}, "-", "", "ns/p gpu-utilization: not reported"),
    ({"vllm-waiting": reading(3), "vllm-running": reading(12)}, "-", "w3 r12", ""),
    ({"vllm-waiting": reading(absent="unsupported"), "vllm-running": reading(2)}, "-",
     "w- r2", "ns/p vllm-waiting: unsupported"),
    ({"tgi-queue": reading(0), "tgi-batch": reading(4)}, "-", "q0 b4", ""),
])
def test_pod_cells(signals: dict[str, tpb.Reading], util: str, queue: str,
                   note: str) -> None:
    view = top.build(pb.FleetReply(stale_after=3.0, pods=[one_pod(**signals)]))
    row = view.pods.rows[0]
    assert row.cells[3].text == util
    assert row.cells[5].text == queue
    assert note in top.explain_row(row)


def test_a_stale_pod_and_a_lost_node_show_dashes_with_why() -> None:
    dev = tpb.Device(uuid="GPU-1", model="NVIDIA L4", sharing="time-sliced",
                     utilization=reading(40), memory_used=reading(1024),
                     memory_total=reading(23034), pods=["ns/p"])
    pod = one_pod(**{"gpu-utilization": reading(40)})
    pod.age = 10.0
    view = top.build(pb.FleetReply(stale_after=3.0, pods=[pod], nodes=[pb.Node(
        name="n1", connected=False, age=12.0, problem="stream lost: reset", devices=[dev])]))
    assert cells(view, "devices") == [
        ["n1", "", "", "-", "-", "stream lost: reset"],
        ["", "0 ts", "L4", "-", "-", "ns/p"]]
    assert "node n1: stream lost: reset" in top.explain_row(view.devices.rows[1])
    assert cells(view, "pods")[0][3] == "-"
    assert "stale, last record 10 s ago (bound 3 s)" in top.explain_row(view.pods.rows[0])


@pytest.mark.parametrize(("name", "short"), [
    ("NVIDIA H100 80GB HBM3", "H100 80GB"), ("NVIDIA A100-SXM4-80GB", "A100 80GB"),
    ("NVIDIA L4", "L4"), ("NVIDIA GeForce RTX 4090", "RTX 4090"), ("Tesla T4", "T4"),
])
def test_short_model(name: str, short: str) -> None:
    assert top.short_model(name) == short


@pytest.mark.parametrize("width", [60, 80, 120, 200])
def test_columns_fit_the_width(width: int) -> None:
    for columns in (top.DEVICE_COLUMNS, top.POD_COLUMNS, top.WORKLOAD_COLUMNS):
        got = top_render.widths(columns, width)
        assert sum(got) + top_render.PAD * len(columns) <= width
        assert all(w >= 3 for w in got)
        if width >= 80:
            assert all(w >= c.width for w, c in zip(got, columns, strict=True))


def test_unknown_sort_is_refused() -> None:
    with pytest.raises(ValueError, match="sort"):
        top.build(pb.FleetReply(), sort="power")


def test_cycle_goes_through_all_then_back() -> None:
    seen: list[Any] = []
    current = ""
    for _ in range(4):
        current = top.cycle(current, ("a", "b"))
        seen.append(current)
    assert seen == ["a", "b", "", "a"]
    assert top.cycle("gone", ("a",)) == ""


def test_a_device_held_through_a_claim_shows_the_claim() -> None:
    dev = tpb.Device(uuid="GPU-1", model="NVIDIA H100 80GB HBM3", sharing="time-sliced",
                     utilization=reading(40), memory_used=reading(1024),
                     memory_total=reading(81559), pods=["ns/p", "ns/q"],
                     claims=["", "ns/q-gpu-x7k2q"])
    view = top.build(pb.FleetReply(stale_after=3.0, nodes=[pb.Node(
        name="n1", connected=True, age=0.5, devices=[dev])]))
    assert cells(view, "devices")[0][-1] == "ns/p, ns/q (claim q-gpu-x7k2q)"
