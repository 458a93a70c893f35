"""The command line as a user runs it: real processes, real signals."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from gpuscale.attribution.sources import AttributionInputs, ScenarioSources
from gpuscale.cli import join_dashed
from gpuscale.telemetry.model import Absent, NodeSnapshot
from gpuscale.telemetry.scenario import parse_scenario
from tests.support.agents import running_agents
from tests.support.polling import until, until_sync
from tests.support.ports import free_port

GPUSCALE = [sys.executable, "-m", "gpuscale.cli"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*GPUSCALE, *args], capture_output=True, text=True, timeout=60,
                          check=False)


def test_gpus_table_and_json() -> None:
    out = run("gpus", "--gpu-backend", "sim", "--scenario", "mig-node")
    assert out.returncode == 0, out.stderr
    assert "node gpu-node-mig  backend sim" in out.stdout
    assert "3g.40gb" in out.stdout
    assert "unsupported" in out.stdout  # A100 MIG utilization
    js = json.loads(run("gpus", "--gpu-backend", "sim", "--json").stdout)
    assert len(js["gpus"]) == 8
    assert js["gpus"][0]["sharing"] == "exclusive"


def test_auto_falls_back_to_simulation_without_nvml() -> None:
    out = run("gpus")
    assert out.returncode == 0
    assert "NVML not usable here" in out.stderr
    assert "using simulated GPUs from scenario 'h100-vllm'" in out.stderr
    assert "H100" in out.stdout


def test_a_scenario_named_is_simulated_without_asking_nvml() -> None:
    """``--scenario`` implies ``--gpu-backend sim``: no NVML probe, none of its warnings;
    with a hardware backend named it is refused."""
    out = run("gpus", "--scenario", "mig-node")
    assert (out.returncode, out.stderr) == (0, "")
    assert "node gpu-node-mig  backend sim" in out.stdout
    out = run("gpus", "--gpu-backend", "nvml", "--scenario", "mig-node")
    assert out.returncode != 0
    assert "--scenario simulates GPUs: not with --gpu-backend nvml" in out.stderr


def test_nvml_backend_without_a_driver_says_so() -> None:
    out = run("gpus", "--gpu-backend", "nvml")
    assert out.returncode == 1
    assert "unavailable: NVML_ERROR_LIBRARY_NOT_FOUND" in out.stdout


def test_bad_scenario_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "s.yaml"
    bad.write_text("nodes: [{name: a, gpus: [{model: X1}]}]\n")
    out = run("gpus", "--gpu-backend", "sim", "--scenario", str(bad))
    assert out.returncode == 2
    assert "nodes[0].gpus[0].model: unknown GPU model 'X1'" in out.stderr
    assert "Traceback" not in out.stderr


def test_agent_serves_then_stops_cleanly_on_sigterm() -> None:
    proc = subprocess.Popen([*GPUSCALE, "agent", "--gpu-backend", "sim", "--port", "0",
                             "--stream-port", "-1",
                             "--host", "127.0.0.1"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "serving metrics at http://127.0.0.1:" in line
        url = line.split("at ")[1].split()[0]
        # The server answers from the start; GPU series appear with the first sample,
        # which /readyz reports.
        ready = url.removesuffix("/metrics") + "/readyz"
        until_sync(lambda: urllib.request.urlopen(ready, timeout=5).status == 200, 10.0,
                   "the first sample", tolerate=(OSError,))
        with urllib.request.urlopen(url, timeout=5) as resp:
            assert b"DCGM_FI_DEV_POWER_USAGE" in resp.read()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert "stopping on signal" in (proc.stderr.read() if proc.stderr else "")
    finally:
        if proc.poll() is None:  # a failed assertion must not leave an agent running
            proc.kill()
            proc.wait()


def test_agent_follows_its_scenario_file(tmp_path: Path) -> None:
    """The cluster launcher's stand-in kubelet rewrites a node's scenario as pods come and go;
    the running agent's readings and pods follow, and a bad rewrite changes nothing."""
    scenario = tmp_path / "n1.yaml"

    def write(text: str) -> None:  # as the stand-in kubelet does: a temp file renamed over
        (tmp_path / "n1.tmp").write_text(text)
        (tmp_path / "n1.tmp").replace(scenario)

    node = "nodes: [{name: n1, gpus: [{model: L4, count: 2}], processes: [%s]}]\n"
    chat = ("{gpu: 1, pid: 4101, memory: 0.9, load: {constant: %s}, "
            "pod: {namespace: llm, name: chat-abc, container: vllm}}")
    write(node % "")
    proc = subprocess.Popen([*GPUSCALE, "agent", "--gpu-backend", "sim", "--scenario",
                             str(scenario), "--port", "0", "--stream-port", "-1",
                             "--interval", "0.2", "--host", "127.0.0.1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().split("at ")[1].split()[0]

        def metrics() -> str:
            with urllib.request.urlopen(url, timeout=5) as resp:
                return str(resp.read().decode())

        def util(value: str) -> bool:
            return f'gpu="1",modelName="NVIDIA L4",namespace="llm",pci_bus_id=' \
                f'"00000000:28:00.0",pod="chat-abc"}} {value}' in metrics()

        def samples() -> float:
            line = next(x for x in metrics().splitlines()
                        if x.startswith("gpuscale_agent_sample_duration_seconds_count"))
            return float(line.split()[1])

        until_sync(lambda: 'gpu="1"' in metrics(), 10.0, "the first sample",
                   tolerate=(OSError,))
        write(node % (chat % 63.5))
        until_sync(lambda: util("63.5"), 10.0, "the new pod's load on GPU 1")
        write(node % (chat % 20))
        until_sync(lambda: util("20.0"), 10.0, "the pod's new load")
        write("nodes: [")
        seen = samples()
        until_sync(lambda: samples() >= seen + 2, 10.0, "two samples of the bad rewrite")
        assert util("20.0")  # the last good scenario
        write(node % (chat % 30))
        until_sync(lambda: util("30.0"), 10.0, "the load after a bad rewrite")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    assert proc.stderr is not None
    assert proc.stderr.read().count("not valid YAML") == 1


def test_agent_port_in_use() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = run("agent", "--gpu-backend", "sim", "--host", "127.0.0.1", "--port", str(port),
              "--stream-port", "-1")
    assert out.returncode == 1
    assert f"cannot serve on 127.0.0.1:{port}" in out.stderr


def test_bad_interval() -> None:
    out = run("agent", "--gpu-backend", "sim", "--interval", "0.05", "--stream-port", "-1")
    assert out.returncode == 2
    assert "at least 0.2" in out.stderr


def test_demo_serves_keda_and_stops_cleanly_with_streams_open() -> None:
    import asyncio

    import grpc

    from gpuscale.proto import externalscaler_pb2 as pb
    from gpuscale.proto import externalscaler_pb2_grpc as pb_grpc

    port = free_port()
    proc = subprocess.Popen([*GPUSCALE, "demo", "--scenario", "h100-vllm", "--host",
                             "127.0.0.1", "--port", str(port),
                             "--metrics-port", "0", "--interval", "0.5"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert "KEDA external scaler on 127.0.0.1:" in proc.stdout.readline()
    ref = pb.ScaledObjectRef(name="demo", namespace="llm",
                             scalerMetadata={"podSelector": "app=vllm-llama"})

    async def talk() -> tuple[float, bool, object]:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.ExternalScalerStub(channel)

            async def busy() -> pb.GetMetricsResponse | None:
                got = await stub.GetMetrics(pb.GetMetricsRequest(
                    scaledObjectRef=ref, metricName="gpuscale-gpu-utilization"))
                return got if got.metricValues[0].metricValueFloat > 0 else None

            got = await until(busy, 5.0, "the first tick in the fleet view", every=0.1)
            average = pb.ScaledObjectRef(name="demo", namespace="llm", scalerMetadata={
                "podSelector": "app=vllm-llama", "metricType": "Value"})

            async def one_tick() -> tuple[float, float] | None:
                """The sum and the per-Ready-pod average from one fleet state (the sum
                read on both sides of the average agrees)."""
                def ask(r: pb.ScaledObjectRef) -> Any:
                    return stub.GetMetrics(pb.GetMetricsRequest(
                        scaledObjectRef=r, metricName="gpuscale-gpu-utilization"))
                before, mean, after = [(await ask(r)).metricValues[0].metricValueFloat
                                       for r in (ref, average, ref)]
                return (before, mean) if before == after else None

            total, mean = await until(one_tick, 5.0, "two answers from one tick", every=0.05)
            # Four vLLM replicas, all Ready: the sum is four times the per-pod average - a
            # pod missing or counted twice would break it.
            assert total == pytest.approx(4 * mean)
            # The simulated vLLM engines, scraped by the agent: KV-cache use per pod summed.
            vllm = pb.ScaledObjectRef(name="demo", namespace="llm", scalerMetadata={
                "podSelector": "app=vllm-llama", "profile": "vllm-inference"})
            kv = await until(lambda: stub.GetMetrics(pb.GetMetricsRequest(
                scaledObjectRef=vllm, metricName="gpuscale-vllm-kv-cache")), 5.0,
                "the first engine scrape", every=0.1, tolerate=(grpc.aio.AioRpcError,))
            assert 4 * 15 < kv.metricValues[0].metricValueFloat < 4 * 95
            stream = stub.StreamIsActive(ref)
            first = (await asyncio.wait_for(stream.read(), 10)).result
            proc.send_signal(signal.SIGTERM)  # with the stream open
            end = await asyncio.wait_for(stream.read(), 10)
            return got.metricValues[0].metricValueFloat, first, end

    value, active, end = asyncio.run(talk())
    # Four vLLM replicas on the 8xH100 node, each 15-90 % busy: the sum, not the mean.
    assert 60.0 < value < 360.0
    assert active is True
    assert end is grpc.aio.EOF
    assert proc.wait(timeout=15) == 0


def test_profiles_lists_every_profile() -> None:
    out = run("profiles")
    assert out.returncode == 0
    for name in ("gpu-utilization", "vllm-inference", "vllm-planner", "triton-inference",
                 "tgi-inference", "training", "batch"):
        assert f"{name}: " in out.stdout
    # Units read as quantities: "70% per pod", "32 requests per pod" (not "32requests").
    assert "gpu-utilization target 70% per pod" in out.stdout
    assert "vllm-requests target 32 requests per pod" in out.stdout
    assert "triton-queue-time target 50 ms per pod" in out.stdout


async def _gpuscale(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(*GPUSCALE, *args, stdout=subprocess.PIPE,
                                                stderr=subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode(), err.decode()


async def test_gpus_reads_a_running_agent_not_a_simulation_of_its_own() -> None:
    """``gpuscale gpus --agent`` shows what the running agent reads (its devices, holders
    and pods' signals) - the numbers the scaler gets - and says plainly when no agent
    answers there."""
    node = parse_scenario({"nodes": [{"name": "n-live", "gpus": [
        {"model": "H100-SXM5-80GB", "count": 1},
        {"model": "A100-SXM4-80GB", "sharing": "mig", "mig": ["3g.40gb", "3g.40gb"]}],
        "processes": [
            {"gpu": 0, "memory_mib": 20_000, "load": {"constant": 37.0},
             "pod": {"namespace": "llm", "name": "chat-0", "container": "c"}},
            {"gpu": 1, "mig": 0, "memory_mib": 1_000, "load": {"constant": 10.0},
             "pod": {"namespace": "llm", "name": "ocr-0", "container": "c"}}]}]}).nodes[0]
    async with running_agents([node]) as (agent,):
        code, out, err = await _gpuscale("gpus", "--agent",
                                         f"127.0.0.1:{agent.stream_port}")
        assert code == 0, err
        assert f"node n-live  (agent 127.0.0.1:{agent.stream_port}" in out
        (h100,) = [line for line in out.splitlines() if "llm/chat-0" in line
                   and "H100" in line]
        assert "37%" in h100  # the agent's reading of the scenario's load
        assert any("3g.40gb" in line and "llm/ocr-0" in line for line in out.splitlines())
        (chat,) = [line for line in out.splitlines() if line.startswith("pod llm/chat-0:")]
        assert "gpu-memory-used 20000" in chat
        assert "gpu-utilization 37" in chat
        (ocr,) = [line for line in out.splitlines() if line.startswith("pod llm/ocr-0:")]
        assert "gpu-utilization unsupported" in ocr  # an A100 MIG instance: as NVML says
        code, out, _ = await _gpuscale("gpus", "--agent", f"127.0.0.1:{agent.stream_port}",
                                       "--json")
        assert code == 0
        got = json.loads(out)
        assert got["node"] == "n-live"
        assert {p["name"] for p in got["pods"]} == {"chat-0", "ocr-0"}
    code, out, err = await _gpuscale("gpus", "--agent", f"127.0.0.1:{free_port()}")
    assert code == 1
    assert err.startswith("gpuscale: agent 127.0.0.1:")
    assert "UNAVAILABLE" in err


@pytest.mark.parametrize(("argv", "want"), [
    (["explain", "a/b", "--at", "-5m"], ["explain", "a/b", "--at=-5m"]),
    (["explain", "a/b", "--at", "03:12"], ["explain", "a/b", "--at", "03:12"]),
    (["explain", "a/b", "--at", "--json"], ["explain", "a/b", "--at", "--json"]),  # argparse's
    (["explain", "a/b", "--at"], ["explain", "a/b", "--at"]),
    (["top", "--interval", "-1"], ["top", "--interval", "-1"]),  # only --at's values
])
def test_a_negative_duration_after_at_is_its_value(argv: list[str], want: list[str]) -> None:
    assert join_dashed(argv) == want


def test_the_operator_tools_run_as_a_kubectl_plugin() -> None:
    """The package installs kubectl-gpuscale beside gpuscale: the real kubectl finds it
    on PATH and runs it as ``kubectl gpuscale``."""
    bindir = Path(sys.executable).parent
    assert (bindir / "kubectl-gpuscale").exists()
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}
    got = subprocess.run(["kubectl", "gpuscale", "explain", "--help"], capture_output=True,
                         text=True, timeout=60, check=False, env=env)
    assert got.returncode == 0, got.stderr
    assert got.stdout.startswith("usage: kubectl gpuscale explain")
    listed = subprocess.run(["kubectl", "plugin", "list"], capture_output=True, text=True,
                            timeout=60, check=False, env=env)
    assert str(bindir / "kubectl-gpuscale") in listed.stdout


class _Unsynced(ScenarioSources):
    """An agent whose pod metadata has not been listed yet: its updates say so and carry
    no devices (as after an agent's start, before its first pod list)."""

    async def gather(self, snapshot: NodeSnapshot) -> AttributionInputs:
        got = await super().gather(snapshot)
        return AttributionInputs(got.allocations, got.allocated_at, Absent.UNAVAILABLE,
                                 got.owners, ("pod watch: not listed yet",))


async def test_gpus_says_why_an_agent_shows_no_devices() -> None:
    node = parse_scenario({"nodes": [{"name": "n-wait", "gpus": [
        {"model": "H100-SXM5-80GB", "count": 1}], "processes": [
            {"gpu": 0, "memory_mib": 1_000, "load": {"constant": 10.0},
             "pod": {"namespace": "llm", "name": "chat-0", "container": "c"}}]}]}).nodes[0]
    async with running_agents([node], sources=[_Unsynced(node)]) as (agent,):
        proc = await asyncio.create_subprocess_exec(
            *GPUSCALE, "gpus", "--agent", f"127.0.0.1:{agent.stream_port}",
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 1
    text = err.decode()
    assert "no update with its devices" in text
    assert "pods are not known" in text
    assert "pod watch: not listed yet" in text


def test_gpus_from_an_agent_shows_a_device_held_through_a_claim_with_it() -> None:
    from gpuscale.cli.gpus import format_report
    from gpuscale.stream.records import DeviceRecord, NodeReport

    gpu = DeviceRecord("GPU-1", 0, "NVIDIA H100 80GB HBM3", pods=("llm/a", "llm/b"),
                       claims=("", "llm/b-gpu-x7k2q"))
    idle = DeviceRecord("GPU-2", 1, "NVIDIA H100 80GB HBM3")
    out = format_report(NodeReport("n", 3, 0.0, 1.0, (), (gpu, idle)), "10.0.0.1:9401")
    (held,) = [line for line in out.splitlines() if line.startswith("0 ")]
    assert held.endswith("  llm/a, llm/b (claim b-gpu-x7k2q)")
    (free,) = [line for line in out.splitlines() if line.startswith("1 ")]
    assert free.endswith("  idle")


def test_gpus_from_an_agent_says_how_many_of_a_mig_gpus_instances_are_in_use() -> None:
    """Pods hold a MIG GPU's instances, never the GPU: it is not "idle" while they run."""
    from gpuscale.cli.gpus import format_report
    from gpuscale.stream.records import DeviceRecord, NodeReport

    parent = DeviceRecord("GPU-1", 0, "NVIDIA A100-SXM4-80GB", sharing="mig")
    slices = [DeviceRecord(f"MIG-{i}", 0, profile, parent_uuid="GPU-1", sharing="mig",
                           pods=pods)
              for i, (profile, pods) in enumerate((("3g.40gb", ("llm/a",)),
                                                   ("2g.20gb", ("llm/b",)),
                                                   ("1g.10gb", ())))]
    out = format_report(NodeReport("n", 3, 0.0, 1.0, (), (parent, *slices)), "h:9401")
    (gpu,) = [line for line in out.splitlines() if "A100" in line]
    assert gpu.endswith("  MIG: 2 of 3 instances in use")
    (free,) = [line for line in out.splitlines() if "1g.10gb" in line]
    assert free.endswith("  idle")
