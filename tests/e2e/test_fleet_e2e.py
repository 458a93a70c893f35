"""Several agents and two scaler replicas as separate processes: the fleet view over the
telemetry streams, and what happens when agents die, freeze or restart."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import urllib.request
from collections.abc import Iterator

import grpc
import pytest

from gpuscale.proto import externalscaler_pb2 as pb
from gpuscale.proto import externalscaler_pb2_grpc as pb_grpc
from tests.support.polling import until_sync
from tests.support.ports import free_port
from tests.support.processes import Proc

pytestmark = pytest.mark.slow

SCENARIO = """
nodes:
""" + "".join(f"""
  - name: node-{n}
    gpus: [{{model: L4, count: 2}}]
    processes:
      - {{gpu: 0, memory_mib: 8000, load: {{constant: {load}}},
         pod: {{namespace: llm, name: w-{n}, container: c}}}}
""" + (f"""      - {{gpu: 1, memory_mib: 8000, load: {{constant: 5}},
         pod: {{namespace: llm, name: solo-{n}, container: c}}}}
""" if n == "a" else "") for n, load in (("a", 30), ("b", 40), ("c", 50)))

INTERVAL = 0.5




@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    tmp = tmp_path_factory.mktemp("fleet")
    scenario = tmp / "fleet.yaml"
    scenario.write_text(SCENARIO)
    streams = {n: free_port() for n in "abc"}
    agents = {n: Proc("agent", "--gpu-backend", "sim", "--scenario", str(scenario),
                      "--node", f"node-{n}", "--host", "127.0.0.1", "--port", "0",
                      "--stream-port", str(streams[n]), "--interval", str(INTERVAL),
                      "--hostname", f"node-{n}", "--stream-insecure")
              for n in "abc"}
    addresses = ",".join(f"127.0.0.1:{p}" for p in streams.values())
    scaler_ports = [free_port(), free_port()]
    scalers = [Proc("scaler", "--host", "127.0.0.1", "--port", str(port), "--metrics-port",
                    str(free_port()), "--agents", addresses, "--agents-insecure")
               for port in scaler_ports]
    try:
        yield {"agents": agents, "scalers": scalers, "ports": scaler_ports, "tmp": tmp}
    finally:
        for p in [*agents.values(), *scalers]:
            p.stop()


def ask(port: int, selector: str) -> tuple[str, float | str]:
    async def go() -> tuple[str, float | str]:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = pb_grpc.ExternalScalerStub(ch)
            req = pb.GetMetricsRequest(
                metricName="gpuscale-gpu-utilization",
                scaledObjectRef=pb.ScaledObjectRef(name="so", namespace="llm",
                                                   scalerMetadata={"podSelector": selector}))
            try:
                got = await asyncio.wait_for(stub.GetMetrics(req), 5)
            except grpc.aio.AioRpcError as exc:
                return exc.code().name, exc.details() or ""
            return "OK", got.metricValues[0].metricValueFloat
    return asyncio.run(go())




def both(cluster: dict[str, object], selector: str) -> list[tuple[str, float | str]]:
    return [ask(p, selector) for p in cluster["ports"]]  # type: ignore[attr-defined]


def test_both_replicas_give_the_sum_over_all_nodes(cluster: dict[str, object]) -> None:
    until_sync(lambda: both(cluster, "app=w") == [("OK", 120.0)] * 2)
    assert both(cluster, "app=solo") == [("OK", 5.0)] * 2


def test_killed_agent_makes_its_workloads_unavailable_then_recovers(
        cluster: dict[str, object]) -> None:
    until_sync(lambda: both(cluster, "app=w") == [("OK", 120.0)] * 2)
    agent_b: Proc = cluster["agents"]["b"]  # type: ignore[index]
    agent_b.p.kill()
    agent_b.p.wait()
    down = until_sync(lambda: all(c == "UNAVAILABLE" for c, _ in both(cluster, "app=w")) and
                 both(cluster, "app=w"))
    assert "llm/w-b (stale" in str(down)
    assert both(cluster, "app=solo") == [("OK", 5.0)] * 2  # node a's workload unaffected
    agent_b.p = agent_b._start()  # same stream port: a restarted agent, new sequence
    restarted = time.monotonic()
    until_sync(lambda: both(cluster, "app=w") == [("OK", 120.0)] * 2)
    print(f"recovered {time.monotonic() - restarted:.2f}s after the agent restarted")


def test_frozen_agent_goes_stale_and_comes_back(cluster: dict[str, object]) -> None:
    until_sync(lambda: both(cluster, "app=w") == [("OK", 120.0)] * 2)
    agent_c: Proc = cluster["agents"]["c"]  # type: ignore[index]
    os.kill(agent_c.p.pid, signal.SIGSTOP)
    try:
        until_sync(lambda: all(c == "UNAVAILABLE" for c, _ in both(cluster, "app=w")))
    finally:
        os.kill(agent_c.p.pid, signal.SIGCONT)
    until_sync(lambda: both(cluster, "app=w") == [("OK", 120.0)] * 2)


def test_scaler_replica_restart_under_keda_like_load(cluster: dict[str, object]) -> None:
    import threading

    until_sync(lambda: both(cluster, "app=w") == [("OK", 120.0)] * 2)
    scalers: list[Proc] = cluster["scalers"]  # type: ignore[assignment]
    other = cluster["ports"][1]  # type: ignore[index]
    answers: list[tuple[str, float | str]] = []
    stop = threading.Event()

    def keda() -> None:  # a caller polling the other replica all through the restart
        while not stop.is_set():
            answers.append(ask(other, "app=w"))
            stop.wait(0.05)  # KEDA's pace, not a wait for anything

    poller = threading.Thread(target=keda)
    poller.start()
    try:
        scalers[0].stop()
        # While the first replica is down the other answers calls: wait for five of them.
        down_from = len(answers)
        until_sync(lambda: len(answers) >= down_from + 5,
                   what="five answers from the other replica while the first is down")
        scalers[0].start()
        until_sync(lambda: both(cluster, "app=w") == [("OK", 120.0)] * 2)
    finally:
        stop.set()
        poller.join()
    # The other replica answered every call, the same as before; the restarted one caught
    # up from the streams.
    assert set(answers) == {("OK", 120.0)}


def test_scaler_metrics_show_agent_links(cluster: dict[str, object]) -> None:
    scalers: list[Proc] = cluster["scalers"]  # type: ignore[assignment]
    port = scalers[1].args[scalers[1].args.index("--metrics-port") + 1]

    def scrape() -> str | None:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text: str = r.read().decode()
        return text if text.count("gpuscale_scaler_agent_connected{") == 3 else None

    body = until_sync(scrape)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
        assert r.read().decode().startswith("ok: 3 agents reporting")
    assert 'node="node-a"' in str(body)
    assert "gpuscale_scaler_fleet_pods 4.0" in str(body)
