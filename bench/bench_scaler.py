"""KEDA scaler latency and signal freshness, for BENCHMARKS.md.

Part 1 - GetMetrics latency. One scaler process holds a fleet view of 1,000 nodes x 8 pods
(8,000 pods) updated at 1 Hz (every node every second, in-process), and 1,000 workloads of
8 pods each (10 namespaces). A separate client process runs 200 concurrent callers over
20 channels, each asking GetMetrics for a random workload:
  a) paced: each caller every 100 ms (2,000 calls/s: far above KEDA's real rate of one
     call per ScaledObject per 15-30 s);
  b) closed loop: as fast as the server answers (throughput, and latency at saturation).
  c) KEDA-like: each caller once a second (200 calls/s; KEDA itself sends about three
     calls per ScaledObject per HPA sync, so ~200 calls/s for 1,000 ScaledObjects).
Reports client-side p50/p99 and the server's own time inside the handler.

Part 2 - freshness. The real agent on the simulated backend at 1 Hz with a load step at a
random phase; from the step to (i) a changed GetMetrics answer and (ii) a StreamIsActive
push of ``true``. p50/p99 over the trials.

Usage: .venv/bin/python bench/bench_scaler.py [--seconds 10] [--trials 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import grpc  # noqa: E402
from prometheus_client import CollectorRegistry, Counter  # noqa: E402

from gpuscale.agent.app import Agent, AgentConfig  # noqa: E402
from gpuscale.attribution.sources import ScenarioSources  # noqa: E402
from gpuscale.proto import externalscaler_pb2 as pb  # noqa: E402
from gpuscale.proto import externalscaler_pb2_grpc as pb_grpc  # noqa: E402
from gpuscale.scaler.answers import Answers  # noqa: E402
from gpuscale.scaler.edges.keda import ScalerServer, ScalerService  # noqa: E402
from gpuscale.scaler.state.fleet import FleetView  # noqa: E402
from gpuscale.stream.records import PodRecord  # noqa: E402
from gpuscale.telemetry.scenario import parse_scenario  # noqa: E402
from gpuscale.telemetry.simulated_gpus import SimulatedBackend  # noqa: E402

NODES, PODS_PER_NODE, WORKLOADS, NAMESPACES = 1000, 8, 1000, 10


def pct(values: list[float], q: float) -> float:
    """The q-quantile of ``values`` in milliseconds (nan when empty)."""
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1e3


def fleet_records(node: int, t: float) -> list[PodRecord]:
    out = []
    for j in range(PODS_PER_NODE):
        w = (node * PODS_PER_NODE + j) % WORKLOADS  # each workload's pods on 8 nodes
        out.append(PodRecord(f"ns{w % NAMESPACES}", f"w{w}-{node}-{j}", f"node-{node}",
                             {"app": f"w{w}"}, None, True,
                             {"gpu-utilization": 50.0 + (node % 7)}, t))
    return out


CLIENT = r"""
import asyncio, json, random, sys, time
import grpc
from gpuscale.proto import externalscaler_pb2 as pb, externalscaler_pb2_grpc as g
port, callers = int(sys.argv[1]), int(sys.argv[2])
seconds, pace = float(sys.argv[3]), float(sys.argv[4])
async def main():
    chans = [grpc.aio.insecure_channel(f"127.0.0.1:{port}") for _ in range(20)]
    for c in chans:
        await c.channel_ready()
    stubs = [g.ExternalScalerStub(c) for c in chans]
    lat, errors = [], 0
    end = time.perf_counter() + seconds
    async def caller(i):
        nonlocal errors
        stub = stubs[i % len(stubs)]
        await asyncio.sleep(random.random() * pace)  # callers are not synchronised
        while time.perf_counter() < end:
            w = random.randrange(1000)
            req = pb.GetMetricsRequest(metricName="s0-gpuscale-gpu-utilization",
                scaledObjectRef=pb.ScaledObjectRef(name=f"w{w}", namespace=f"ns{w % 10}",
                                                   scalerMetadata={"podSelector": f"app=w{w}"}))
            t0 = time.perf_counter()
            try:
                await stub.GetMetrics(req)
                lat.append(time.perf_counter() - t0)
            except grpc.aio.AioRpcError:
                errors += 1
            if pace:
                await asyncio.sleep(max(0.0, pace - (time.perf_counter() - t0)))
    cpu0 = time.process_time()
    await asyncio.gather(*(caller(i) for i in range(callers)))
    print(json.dumps({"lat": lat, "errors": errors, "cpu": time.process_time() - cpu0}))
asyncio.run(main())
"""


SERVER_CORE, CLIENT_CORE = 0, 1  # the scaler has one core; its clients the other
PATH = "/externalscaler.ExternalScaler/GetMetrics"


def pin_process(cores: int | set[int]) -> None:
    """Pin every thread of this process (grpc's C-core threads too) to ``cores``; threads
    started later inherit the mask."""
    mask = {cores} if isinstance(cores, int) else cores
    for tid in os.listdir("/proc/self/task"):
        with suppress(OSError):  # a thread that has just ended
            os.sched_setaffinity(int(tid), mask)


def on_client_core(argv: list[str]) -> list[str]:
    return ["taskset", "-c", str(CLIENT_CORE), *argv] if shutil.which("taskset") else argv


def grpc_frame(request: pb.GetMetricsRequest) -> bytes:
    """A request as gRPC frames it on the wire (uncompressed flag, length, message)."""
    body = request.SerializeToString()
    return b"\x00" + len(body).to_bytes(4, "big") + body


async def h2load(port: int, seconds: float, paced: bool) -> tuple[str, list[float]] | None:
    """GetMetrics from h2load (nghttp2's C load generator, on the client core): its own
    CPU per call is small, so what it measures is the scaler, about as a Go client such as
    KEDA's would see it. ``paced``: 200 connections, each one call a second, started 5 ms
    apart (200 calls/s spread evenly); else a closed loop (4 connections x 50 streams) to
    saturate the scaler's core. One workload's request repeated (every workload's answer
    comes from the same caches). Returns h2load's summary and, when paced, each call's
    latency in seconds (from its log); None when h2load is not installed."""
    if shutil.which("h2load") is None:
        return None
    w = 7
    req = pb.GetMetricsRequest(metricName="s0-gpuscale-gpu-utilization",
                               scaledObjectRef=pb.ScaledObjectRef(
                                   name=f"w{w}", namespace=f"ns{w % NAMESPACES}",
                                   scalerMetadata={"podSelector": f"app=w{w}"}))
    load = (["-n", str(round(200 * seconds)), "-c", "200", "-r", "1", "--rate-period", "5ms",
             "--rps", "1"] if paced else
            ["-D", str(max(1, round(seconds))), "-c", "4", "-m", "50"])
    with tempfile.TemporaryDirectory() as tmp:
        data, log = Path(tmp) / "request.grpc", Path(tmp) / "calls.log"
        data.write_bytes(grpc_frame(req))
        proc = await asyncio.create_subprocess_exec(*on_client_core([
            "h2load", *load, "-H", "content-type: application/grpc", "-H", "te: trailers",
            "-d", str(data), f"--log-file={log}", f"http://127.0.0.1:{port}{PATH}"]),
            stdout=asyncio.subprocess.PIPE)
        out, _ = await proc.communicate()
        lat = ([int(line.split()[2]) / 1e6 for line in log.read_text().splitlines()]
               if paced else [])
    summary = next((x.strip() for x in out.decode().splitlines() if "req/s" in x), "?")
    return summary, lat


async def latency(seconds: float) -> None:
    pin_process(SERVER_CORE)
    fleet = FleetView(stale_after=3.0)
    now = time.monotonic()
    for n in range(NODES):
        fleet.update_node(f"node-{n}", fleet_records(n, now))
    registry = CollectorRegistry(auto_describe=False)  # counted as the scaler counts
    requests = Counter("gpuscale_scaler_requests", "calls", ["method", "code"],
                       registry=registry)
    service = ScalerService(Answers(fleet), count=lambda m, c: requests.labels(m, c).inc())
    handler_times: list[float] = []
    original = service.GetMetrics

    async def timed(request, context):
        t0 = time.perf_counter()
        try:
            return await original(request, context)
        finally:
            handler_times.append(time.perf_counter() - t0)

    service.GetMetrics = timed  # type: ignore[method-assign]
    server = ScalerServer(service, host="127.0.0.1", port=0)
    await server.start()
    pin_process(SERVER_CORE)

    def answered() -> dict[str, float]:
        return {code: registry.get_sample_value("gpuscale_scaler_requests_total",
                                                {"method": "GetMetrics", "code": code}) or 0.0
                for code in ("OK", "UNAVAILABLE", "INVALID_ARGUMENT", "INTERNAL")}

    async def updates() -> None:
        """Every node once a second, one node per turn of the event loop at evenly spread
        times, as the scaler's subscriber applies each agent's message as it arrives."""
        start = time.monotonic()
        while True:
            for n in range(NODES):
                fleet.update_node(f"node-{n}", fleet_records(n, time.monotonic()))
                start += 1.0 / NODES
                await asyncio.sleep(max(0.0, start - time.monotonic()))

    t0 = time.perf_counter()
    for n in range(NODES):
        fleet.update_node(f"node-{n}", fleet_records(n, time.monotonic()))
    print(f"  ingest: one update of all {NODES} nodes ({NODES * PODS_PER_NODE} pods) takes "
          f"{(time.perf_counter() - t0) * 1e3:.1f} ms of the event loop")
    feeder = asyncio.create_task(updates())
    try:
        cpu0, wall0 = time.process_time(), time.perf_counter()
        await asyncio.sleep(min(seconds, 5.0))
        idle = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
        print(f"  scaler core {SERVER_CORE}, clients core {CLIENT_CORE}; scaler CPU with no "
              f"calls (the 1 Hz updates): {idle * 100:.1f} % of its core")

        def server_cost(cpu: float, wall: float, calls: float) -> str:
            per_call = (cpu - idle * wall) / max(calls, 1.0)
            return (f"scaler CPU {cpu / wall * 100:.0f} % of its core, "
                    f"{per_call * 1e6:.0f} us per call beyond the updates")

        for label, pace in (("KEDA-like, each caller every 1 s", 1.0),
                            ("paced, each caller every 100 ms", 0.1),
                            ("closed loop, Python client", 0.0)):
            handler_times.clear()
            before = answered()
            cpu0, wall0 = time.process_time(), time.perf_counter()
            proc = await asyncio.create_subprocess_exec(
                *on_client_core([sys.executable, "-c", CLIENT, str(server.port), "200",
                                 str(seconds), str(pace)]),
                stdout=asyncio.subprocess.PIPE, env={**os.environ,
                                                     "PYTHONPATH": str(REPO / "src")})
            out, _ = await proc.communicate()
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            after = answered()
            res = json.loads(out)
            lat = res["lat"]
            calls = after["OK"] - before["OK"]
            print(f"  {label}: {len(lat) / seconds:,.0f} calls/s, client p50 "
                  f"{pct(lat, 0.5):.2f} ms p99 {pct(lat, 0.99):.2f} ms; handler p50 "
                  f"{pct(handler_times, 0.5):.3f} ms p99 {pct(handler_times, 0.99):.3f} ms; "
                  f"errors {res['errors']}; {server_cost(cpu, wall, calls)}; client CPU "
                  f"{res['cpu'] / seconds * 100:.0f} % of its core")
        await through_h2load(server.port, seconds, handler_times, answered, server_cost)
    finally:
        feeder.cancel()
        await server.stop(0.5)


async def through_h2load(port: int, seconds: float, handler_times: list[float],
                         answered: Callable[[], dict[str, float]],
                         server_cost: Callable[[float, float, float], str]) -> None:
    """latency()'s runs with h2load as the client (a C client: the server's own cost
    alone), KEDA-like and closed loop."""
    for label, paced in (("KEDA-like, h2load, 200 calls/s spread evenly", True),
                         ("closed loop, h2load (4 connections x 50 streams)", False)):
        handler_times.clear()
        before = answered()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        got = await h2load(port, seconds, paced)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        after = answered()
        if got is None:
            print(f"  {label}: h2load not installed (apt install nghttp2-client)")
            continue
        summary, lat = got
        ok = after["OK"] - before["OK"]
        other = sum(after.values()) - sum(before.values()) - ok
        client = (f"client p50 {pct(lat, 0.5):.2f} ms p99 {pct(lat, 0.99):.2f} ms p99.9 "
                  f"{pct(lat, 0.999):.2f} ms; " if lat else "")
        print(f"  {label}: {ok / wall:,.0f} OK calls/s over {wall:.1f} s, {other:.0f} not "
              f"OK; {client}handler p50 {pct(handler_times, 0.5):.3f} ms p99 "
              f"{pct(handler_times, 0.99):.3f} ms; {server_cost(cpu, wall, ok)}; "
              f"h2load: {summary}")


async def freshness(trials: int) -> None:
    to_metric: list[float] = []
    to_push: list[float] = []
    for _ in range(trials):
        step_at = 2.0 + random.random()  # scenario seconds; the phase against ticks varies
        doc = {"nodes": [{"name": "n", "gpus": [{"model": "L4"}], "processes": [
            {"gpu": 0, "memory_mib": 1000, "load": {"steps": [[0, 0], [step_at, 80]]},
             "pod": {"namespace": "ns", "name": "w-0", "container": "c"}}]}]}
        node = parse_scenario(doc).nodes[0]
        fleet = FleetView(stale_after=3.0)
        start = time.time()
        backend = SimulatedBackend(node, start=start)
        agent = Agent(backend, AgentConfig("127.0.0.1", 0, 1.0, "n"), ScenarioSources(node))
        agent.add_sink(fleet)
        server = ScalerServer(ScalerService(Answers(fleet)), host="127.0.0.1", port=0)
        await server.start()
        task = asyncio.create_task(agent.run())
        ref = pb.ScaledObjectRef(name="w", namespace="ns",
                                 scalerMetadata={"podSelector": "app=w"})
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.ExternalScalerStub(ch)
            stream = stub.StreamIsActive(ref)

            async def pushed(stream: Any = stream) -> float:
                while True:
                    msg = await stream.read()
                    if msg is grpc.aio.EOF:
                        raise RuntimeError("stream ended")
                    if msg.result:
                        return time.time()

            push_task = asyncio.create_task(pushed())
            changed = None
            while changed is None:
                try:
                    got = await stub.GetMetrics(pb.GetMetricsRequest(
                        scaledObjectRef=ref, metricName="gpuscale-gpu-utilization"))
                    if got.metricValues[0].metricValueFloat > 0:
                        changed = time.time()
                except grpc.aio.AioRpcError:
                    pass
                await asyncio.sleep(0.005)
            pushed_at = await asyncio.wait_for(push_task, 5)
            stream.cancel()
        to_metric.append(changed - (start + step_at))
        to_push.append(pushed_at - (start + step_at))
        task.cancel()
        await server.stop(0.2)
    print(f"  load step -> GetMetrics changed: p50 {pct(to_metric, 0.5):.0f} ms, p99 "
          f"{pct(to_metric, 0.99):.0f} ms; -> StreamIsActive push: p50 "
          f"{pct(to_push, 0.5):.0f} ms, p99 {pct(to_push, 0.99):.0f} ms ({trials} trials)")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--trials", type=int, default=20)
    args = parser.parse_args()
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, grpcio {grpc.__version__}, "
          f"{time.strftime('%Y-%m-%d')}")
    from bench.grpc_floor import yardstick

    print(yardstick())
    print(f"1. GetMetrics, {WORKLOADS} workloads, {NODES * PODS_PER_NODE} pods updated at "
          f"1 Hz, 200 concurrent callers in another process:")
    await latency(args.seconds)
    if args.trials:
        print("2. freshness at 1 Hz sampling:")
        await freshness(args.trials)


if __name__ == "__main__":
    asyncio.run(main())
