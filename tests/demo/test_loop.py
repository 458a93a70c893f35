"""The demo's closed loop: simulated replicas -> agents -> scaler over gRPC -> KEDA/HPA model
-> replicas, run as the real command, plus the world's bookkeeping."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from gpuscale.demo.loop import _retried
from gpuscale.demo.view import Status, View, grpcurl_hint
from gpuscale.demo.world import LiveConfig, SimClock, World
from gpuscale.proto import externalscaler_pb2 as pb
from gpuscale.proto import externalscaler_pb2_grpc as pb_grpc
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.telemetry.model import Absent
from gpuscale.traffic.patterns import synthetic
from tests.support.polling import until, until_sync
from tests.support.ports import free_port

DEMO = [sys.executable, "-m", "gpuscale.cli", "demo"]
# Simulated time, then the wall-clock time in UTC that explain --at takes (test_lookup).
DECISION = re.compile(r"^(\d\d:\d\d:\d\d) sim \((\d\d:\d\d:\d\d) UTC\) replicas (\d+) -> "
                      r"(\d+): (KEDA|HPA): ")




def test_world_keeps_pods_parallel_to_replicas_on_distinct_gpus() -> None:
    world = World(LiveConfig(synthetic("bursts", 120, 5.0), 120.0, nodes=2, max_replicas=16))
    world.scale(3, warm=True)
    world.mark_ready(world.serving())
    assert [p.name for p in world.serving()] == [p.name for p in world.pods]
    world.scale(12)
    assert len(world.pods) == len(world.model.replicas) == 12
    assert len({(p.node, p.gpu) for p in world.pods}) == 12
    assert len({p.ip for p in world.pods}) == 12
    assert {p.node for p in world.pods} == {0, 1}  # the first node's 8 GPUs, then the next
    assert world.ready_count() == 3  # the new nine are starting
    infos = world.sources[1].pod_infos()
    assert not isinstance(infos, Absent)
    assert all(not i.ready for i in infos.values())  # node 2 holds only new pods
    first = [p.name for p in world.pods[:3]]
    world.scale(2)  # the newest go first, as the serving fleet removes them
    assert [p.name for p in world.pods] == first[:2]
    assert world.ready_count() == 2
    world.scale(40)  # more than the nodes hold: capped at their GPUs
    assert len(world.pods) == 16


def test_world_serves_the_replicas_numbers_as_vllm_metrics() -> None:
    world = World(LiveConfig(synthetic("diurnal", 300, 30.0), 300.0))
    world.scale(2, warm=True)
    world.advance(120.0)
    text = "".join(world.engine_text(p) for p in world.pods)
    running = sum(float(v) for v in re.findall(r"vllm:num_requests_running\{.*\} (\S+)", text))
    assert running == sum(len(r.running) for r in world.model.replicas)
    assert running > 0
    assert world.duty_cycle(world.pods[0]) > 0


@pytest.mark.parametrize(("args", "why"), [
    (["--max-replicas", "40"], "--max-replicas"),
    (["--profile", "nope"], "not one of"),
    (["--speed", "0"], "--speed"),
    (["--rate", "-1"], "positive"),
    (["--rate", "0"], "positive"),
    (["--scenario", "h100-vllm", "--pattern", "bursts"], "--pattern drive the closed loop"),
    (["--trace", "/nonexistent.csv"], "nonexistent"),
])
def test_bad_demo_options_are_clear_errors(args: list[str], why: str) -> None:
    out = subprocess.run([*DEMO, "--port", str(free_port()), *args], capture_output=True,
                         text=True, timeout=60, check=False)
    assert out.returncode == 2
    assert why in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.slow
def test_demo_loop_follows_load_over_grpc_and_summarizes() -> None:
    """The README's run command, shortened: replicas follow a burst, an outside gRPC client
    sees the same scaler KEDA's model is calling, and the run ends with a summary."""
    port = free_port()
    proc = subprocess.Popen([*DEMO, "--port", str(port), "--pattern", "bursts",
                             "--duration", "600", "--speed", "30"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    header = proc.stdout.readline()
    assert f"KEDA external scaler on 127.0.0.1:{port}" in header
    hint = proc.stdout.readline()
    assert hint.strip().startswith("gpuscale keda GetMetrics '")
    assert hint.rstrip().endswith(f"' --scaler 127.0.0.1:{port}")
    asked = json.loads(hint.split("GetMetrics '", 1)[1].split("'", 1)[0])
    watch = proc.stdout.readline()  # idle's window is wall-clock time: the line says so
    assert "(wall-clock minutes: the times here are simulated, x30" in watch, watch

    async def ask() -> float:
        ref = pb.ScaledObjectRef(name="x", namespace="llm", scalerMetadata={
            "podSelector": "app=vllm-demo", "profile": "vllm-inference"})
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.ExternalScalerStub(channel)

            async def requests() -> float:
                got = await stub.GetMetrics(pb.GetMetricsRequest(
                    scaledObjectRef=ref, metricName="gpuscale-vllm-requests"), timeout=2)
                return max(float(got.metricValues[0].metricValueFloat), 0.0)

            # An RPC error: the first scrape has not landed yet.
            got = float(await until(requests, 10.0, "the demo's scaler reporting requests",
                                    every=0.1, tolerate=(grpc.aio.AioRpcError,)))
            # The printed hint asks for the value KEDA gets (GetMetrics), and gets one
            # (once the planner has seen two scrapes of the engines' counters).
            async def hinted() -> float:
                reply = await stub.GetMetrics(pb.GetMetricsRequest(
                    scaledObjectRef=pb.ScaledObjectRef(**asked["scaledObjectRef"]),
                    metricName=asked["metricName"]), timeout=5)
                return float(reply.metricValues[0].metricValueFloat)
            assert await until(hinted, 10.0, "the hint's value", every=0.1,
                               tolerate=(grpc.aio.AioRpcError,)) > 0
            return got

    assert asyncio.run(ask()) > 0
    # The operator tools the demo prints work against it while it runs.
    scaler = f"127.0.0.1:{port}"
    for tool, want in ((["explain", "llm/vllm-demo"], "vllm-demo"),
                       (["top", "--once"], "vllm-demo"),
                       (["idle", "--window", "5m"], "")):
        got = subprocess.run([sys.executable, "-m", "gpuscale.cli", *tool, "--scaler", scaler],
                             capture_output=True, text=True, timeout=60, check=False)
        assert got.returncode == 0, (tool, got.stderr)
        assert want in got.stdout, (tool, got.stdout)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    decisions = [DECISION.match(line) for line in out.splitlines()]
    ups = [m for m in decisions if m and int(m[4]) > int(m[3])]
    assert ups, out
    # The HPA's reasons carry the numbers it got over gRPC from gpuscale's planner (the
    # default profile), and every minute's line shows the plan and its terms.
    assert all("planned-replicas" in line for line in out.splitlines()
               if DECISION.match(line))
    assert re.search(r"plan \d+ \(held; now ceil\(max\(steady [\d.]+, burst", out), out
    assert re.search(r"missed in \d+ of 10 minutes", out)
    # The ending compares what a user would run, and says which figure is hindsight.
    assert "replaying them in the simulator" in out  # said before the seconds it takes
    tail = out[out.index("the same requests, other ways (simulated):"):].splitlines()
    assert tail[2].split()[:4] == ["this", "run:", "gpuscale", "vllm-planner,"]
    assert tail[2].split()[4] == "live"  # named apart from the same profile simulated
    assert "(sized in advance)" in tail[3]
    assert "gpuscale vllm-inference, simulated, KEDA defaults" in tail[4]
    assert "(the peak, known only in hindsight)" in tail[5]
    assert "not a budget that" in "\n".join(tail[6:])  # why the peak is no 40 % waste
    assert all(len(line) <= 80 for line in out[out.index("\nsimulated "):].splitlines())
    assert "Traceback" not in err


@pytest.mark.slow
def test_demo_loop_scales_to_zero_when_idle_and_stops_on_sigint() -> None:
    port = free_port()
    proc = subprocess.Popen([*DEMO, "--port", str(port), "--pattern", "idle-night",
                             "--rate", "10", "--duration", "1500", "--speed", "60",
                             "--min-replicas", "0", "--profile", "vllm-inference"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    seen = []
    deadline = time.monotonic() + 60
    for line in proc.stdout:
        seen.append(line)
        m = DECISION.match(line)
        if m and m[4] == "0":
            break
        assert time.monotonic() < deadline, "".join(seen)
    # KEDA, not the HPA, takes the last replica away, after the cooldown with no activity.
    assert "KEDA: inactive for" in seen[-1]
    proc.send_signal(signal.SIGINT)  # before the end: still a summary, exit 0
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err[-2000:]
    assert "the same requests, other ways (simulated):" in out


def test_a_taken_port_is_a_clear_error() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        out = subprocess.run([*DEMO, "--port", str(port), "--duration", "60"],
                             capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 1
    assert "cannot listen" in out.stderr
    assert "in use" in out.stderr  # the port's own error, not "errors in a TaskGroup"
    assert "Traceback" not in out.stderr


def test_the_terminal_screen_fits_its_width_and_shows_the_hints() -> None:
    """On a terminal the screen is cut to its width (80 here), never wrapped mid-word,
    shows the explain and top commands, and the GetMetrics command wrapped at spaces
    between JSON tokens, so it pastes as one command."""
    world = World(LiveConfig(synthetic("bursts", 120, 5.0), 120.0, nodes=2, max_replicas=16))
    world.scale(3, warm=True)
    hint = grpcurl_hint("127.0.0.1:6000", {"podSelector": "app=vllm-demo",
                                            "profile": "vllm-planner", "maxBatch": "256"})
    view = View(world, SimClock(40.0), Status(), FleetView(), "127.0.0.1:6000", True,
                print, hint=hint)
    lines = view.screen(80)
    assert max(len(line) for line in lines) <= 80
    # The bounds its scaler cannot see, given (item 2 of issue 42); split to fit 80.
    assert ("try       gpuscale explain llm/vllm-demo --min-replicas 1 --max-replicas 16 \\"
            in lines)
    assert "            --scaler 127.0.0.1:6000" in lines
    assert any(line.startswith("          gpuscale top --scaler") for line in lines)
    shown = lines[lines.index("what KEDA gets (paste into another terminal):") + 1:]
    assert " ".join(line.strip() for line in shown) == hint
    request = json.loads(hint.split("GetMetrics '", 1)[1].split("'", 1)[0])
    assert request["metricName"] == "gpuscale-planned-replicas"
    assert hint.endswith("' --scaler 127.0.0.1:6000")


@pytest.mark.slow
def test_the_closed_loop_through_the_plain_hpa_path_with_kubectl() -> None:
    """``demo --hpa``: the scaler serves the custom metrics API in local mode, an HPA
    model reads it over HTTPS and scales the replicas, and the real kubectl reads the
    same answer with the kubeconfig the run prints; without the token: 401."""
    proc = subprocess.Popen([*DEMO, "--hpa", "--port", str(free_port()), "--pattern",
                             "bursts", "--duration", "300", "--speed", "30"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        head = proc.stdout.readline()
        assert head.startswith("custom metrics API (local mode, loopback only) on https://"
                               "127.0.0.1:"), head
        kubectl = proc.stdout.readline().strip()
        assert kubectl.startswith("kubectl --kubeconfig ")
        kubeconfig = kubectl.split()[2]
        path = kubectl.split("get --raw ", 1)[1].strip("'")

        def read() -> dict[str, Any] | None:
            got = subprocess.run(["kubectl", "--kubeconfig", kubeconfig, "get", "--raw",
                                  path], capture_output=True, text=True, timeout=30,
                                 check=False)
            return json.loads(got.stdout) if got.returncode == 0 else None

        body = until_sync(read, 30.0, "kubectl reading the planned replicas")
        assert body["kind"] == "MetricValueList"
        (item,) = body["items"]
        assert item["metric"]["name"] == "gpuscale_planned_replicas"
        assert item["describedObject"] == {"kind": "Deployment", "namespace": "llm",
                                           "name": "vllm-demo", "apiVersion": "apps/v1"}
        # Without the token: the cluster's answer to no credentials.
        server = yaml.safe_load(Path(kubeconfig).read_text())["clusters"][0]["cluster"]
        ctx = ssl.create_default_context(cafile=server["certificate-authority"])
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(server["server"] + path, context=ctx, timeout=10)
        assert refused.value.code == 401
        assert json.loads(refused.value.read())["kind"] == "Status"
        # The banner's explain, as printed: the Deployment the HPA reads, the HPA alone.
        serving = "".join(proc.stdout.readline() for _ in range(2))
        printed = re.search(r"why this count: (gpuscale explain [^;]+?) \(", serving)
        assert printed, serving
        words = printed[1].split()
        explained = subprocess.run([sys.executable, "-m", "gpuscale.cli", *words[1:]],
                                   capture_output=True, text=True, timeout=60, check=False)
        assert explained.returncode == 0, explained.stderr
        assert explained.stdout.startswith("Deployment llm/vllm-demo (read by an HPA "
                                           "through custom.metrics.k8s.io)\n"), explained.stdout
        assert "clamped to min 1, max 16 (given with" in explained.stdout
        assert "KEDA" not in explained.stdout
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-2000:]
    assert re.search(r"replicas 1 -> \d+: HPA: metrics propose", out), out
    assert "the same requests, other ways (simulated):" in out
    # explain and top show the Deployment the HPA reads (no ScaledObject on this path)
    assert "(the Deployment the HPA reads through custom.metrics.k8s.io" in serving
    assert "Traceback" not in err


@pytest.mark.slow
@pytest.mark.parametrize(("path", "woke"), [
    ([], r"replicas 0 -> 1: KEDA: activated from zero"),
    (["--hpa"], r"replicas 0 -> 1: HPA: metrics propose 1; .*gpuscale_demand_pending 1"),
])
def test_the_loop_scales_to_zero_and_back_when_work_waits_at_the_gateway(
        path: list[str], woke: str) -> None:
    """The documented commands (README, docs/hpa.md: ``./dev run [--hpa] --min-replicas 0
    --pattern idle-gap``), fast-forwarded: the quiet 30-70 % of the hour takes the
    workload to zero, and demand after it brings it back. At zero pods only the gateway's
    queue shows the load, so the demo declares it as the scaler's demand source; KEDA
    (IsActive) - or, with --hpa, the HPA on gpuscale_demand_pending (Kubernetes 1.37's
    scale to zero) - wakes the workload."""
    out = subprocess.run([*DEMO, *path, "--port", str(free_port()), "--min-replicas", "0",
                          "--pattern", "idle-gap", "--speed", "60"],  # a shared CI core
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    to_zero = re.search(r"replicas [12] -> 0: ", out.stdout)
    assert to_zero, out.stdout
    back = re.search(woke, out.stdout)
    assert back, out.stdout
    assert to_zero.start() < back.start()
    assert "Traceback" not in out.stderr


def test_a_taken_metrics_api_port_is_a_clear_error_not_a_hang() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        out = subprocess.run([*DEMO, "--hpa", "--metrics-api-port", str(port), "--port",
                              str(free_port()), "--duration", "60"],
                             capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 1
    assert "cannot listen" in out.stderr
    assert "Traceback" not in out.stderr


async def test_a_failed_call_is_tried_once_more_as_kedas_scaler_cache_does() -> None:
    """scalers_cache.go GetMetricsAndActivityForScaler: after an error KEDA rebuilds the
    scaler (refreshScaler) and calls once more; only a second error is KEDA's failure."""
    calls: list[str] = []

    def failing(times: int) -> Any:
        async def call(request: str, **_: float) -> str:  # (timeout=)
            calls.append(request)
            if len(calls) <= times:
                raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(),
                                           grpc.aio.Metadata(), "no data")
            return "answer"
        return call

    assert await _retried(failing(1), "ref") == "answer"
    assert calls == ["ref", "ref"]
    calls.clear()
    with pytest.raises(grpc.aio.AioRpcError):
        await _retried(failing(2), "ref")
    assert len(calls) == 2
