"""One scaler process fed by 1,000 simulated agents (8 GPU pods each) at 1 Hz.

Generator processes serve the agents' telemetry streams (the real TelemetryPublisher, one
gRPC server per agent, each publishing 8 pods once a second). By default the agents tick in
groups of 25, 40 groups a second (a harsher pattern than a real fleet's: the scaler gets 25
updates at once); ``BENCH_FLEET_PHASES=independent`` gives each agent a phase of its own,
drawn once, as real agents have (each ticks from its own start, agent/sampler.py). The real
``gpuscale scaler`` subscribes to all of them. Reported:
  - update propagation: the scaler's gpuscale_scaler_update_delay_seconds histogram (agent
    sample -> update applied; same machine, same clock), p50/p99 from its buckets, and a
    direct probe: flip one agent's load, poll GetMetrics until it shows (N probes);
  - the scaler's CPU (% of one core) and RSS over the measurement;
  - GetMetrics p50/p99 from a prober asking for random workloads meanwhile;
  - message size: a full update vs what a delta (changed pods only) would carry.

Usage: .venv/bin/python bench/bench_fleet.py [--agents 1000] [--seconds 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import grpc  # noqa: E402

from gpuscale.attribution.model import OwnerRef  # noqa: E402
from gpuscale.proto import externalscaler_pb2 as pb  # noqa: E402
from gpuscale.proto import externalscaler_pb2_grpc as pb_grpc  # noqa: E402
from gpuscale.proto import telemetry_pb2_grpc as tpb_grpc  # noqa: E402
from gpuscale.stream.publisher import TelemetryPublisher  # noqa: E402
from gpuscale.stream.records import DeviceRecord, NodeReport, PodRecord  # noqa: E402

PODS = 8
WORKLOADS = 1000
BOOST = 300.0  # a flipped node's pods' utilization on top of their own (<= the 1,000 % bound)
WITH_DEVICES = os.environ.get("BENCH_FLEET_DEVICES", "1") == "1"  # set by --no-devices
INDEPENDENT = os.environ.get("BENCH_FLEET_PHASES", "grouped") == "independent"


#: Each workload's ReplicaSet: a real agent's pods carry their owner (from the kubelet's
#: pod list), and the scaler decodes it with every update.
OWNERS = [OwnerRef("ReplicaSet", f"w{w}-7d9f8c") for w in range(WORKLOADS)]


def records(node: int, boost: float = 0.0) -> list[PodRecord]:
    out = []
    t = time.monotonic()
    for j in range(PODS):
        w = (node * PODS + j) % WORKLOADS
        util = 40.0 + 20.0 * ((t + node) % 7) / 7 + boost
        out.append(PodRecord(f"ns{w % 10}", f"w{w}-{node}-{j}", f"node-{node}",
                             {"app": f"w{w}", "pod-template-hash": "7d9f8c"},
                             OWNERS[w], True, {"gpu-utilization": util, "gpu-memory": 91.5,
                                          "vllm-waiting": 2.0, "vllm-kv-cache": 63.0}, t))
    return out


def devices(node: int, pods: list[PodRecord]) -> list[DeviceRecord]:
    """The node's 8 GPUs, one per pod, as a real agent streams them (operator tools)."""
    return [DeviceRecord(f"GPU-{node:08x}-{j:04x}-0000-0000-000000000000", j,
                         "NVIDIA H100 80GB HBM3", utilization=p.signals["gpu-utilization"],
                         memory_used_mib=74600.0, memory_total_mib=81559.0,
                         pods=(f"{p.namespace}/{p.name}",))
            for j, p in enumerate(pods)]


async def generate(first: int, count: int, port_base: int, control: int) -> None:
    """Serve agents first..first+count-1 on port_base+i; a control port flips boosts."""
    pubs = []
    for i in range(count):
        node = first + i
        pub = TelemetryPublisher(f"node-{node}", 1.0)
        server = grpc.aio.server()
        tpb_grpc.add_AgentTelemetryServicer_to_server(pub, server)
        server.add_insecure_port(f"127.0.0.1:{port_base + i}")
        await server.start()
        pubs.append((node, pub, server))
    boosts: dict[int, float] = {}

    async def on_control(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A line with a node's number flips its boost (0 <-> BOOST); the reply is the new
        boost. The generator keeps the state: a probe that set it itself from what it had
        sent would flip nothing for a node an earlier client left boosted (bench_keda's
        10,000 run follows its 1,000 run on the same generators)."""
        node = int((await reader.readline()).split()[0])
        boosts[node] = 0.0 if boosts.get(node) else BOOST
        writer.write(f"{boosts[node]:g}\n".encode())
        await writer.drain()
        writer.close()

    await asyncio.start_server(on_control, "127.0.0.1", control)
    print("ready", flush=True)
    if INDEPENDENT:  # each agent at its own phase, drawn once (a real agent's start)
        phases = sorted((random.Random(node).random(), k) for k, (node, _, _) in
                        enumerate(pubs))
    else:  # groups of 25, spread over the second
        phases = [((k // 25) * 25 / len(pubs), k) for k in range(len(pubs))]
    start = time.monotonic()
    while True:
        for phase, k in phases:
            if (delay := start + phase - time.monotonic()) > 0:
                await asyncio.sleep(delay)
            node, pub, _ = pubs[k]
            recs = records(node, boosts.get(node, 0.0))
            pub.publish_report(NodeReport(
                pub.node, pub.seq + 1, time.monotonic(), 1.0, tuple(recs),
                tuple(devices(node, recs)) if WITH_DEVICES else ()))
        start = max(start + 1.0, time.monotonic())  # a slow round: no catching up at once


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
    return 0.0


def _buckets(text: str, name: str) -> dict[float, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith(f"{name}_bucket"):
            le = line.split('le="')[1].split('"')[0]
            out[float("inf") if le == "+Inf" else float(le)] = float(line.split()[-1])
    return out


def histogram_quantiles(text: str, name: str, before: str) -> tuple[float, float, int]:
    """p50 and p99 upper bounds of the observations made between two scrapes."""
    start, end = _buckets(before, name), _buckets(text, name)
    buckets = sorted((le, c - start.get(le, 0.0)) for le, c in end.items())
    total = buckets[-1][1] if buckets else 0

    def q(p: float) -> float:
        for le, c in buckets:
            if c >= p * total:
                return le
        return float("inf")
    return q(0.5), q(0.99), int(total)


async def flip(port: int, node: int, timeout: float = 10.0) -> float:
    """Flip ``node``'s boost through its generator's control ``port``: the new boost.
    Raises OSError, ValueError (no reply) or TimeoutError."""
    async def ask() -> float:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(f"{node}\n".encode())
            await writer.drain()
            return float(await reader.readline())
        finally:
            writer.close()
    return await asyncio.wait_for(ask(), timeout)


async def probe(scaler_port: int, controls: list[tuple[int, int, int]], n: int,
                latencies: list[float]) -> list[float]:
    """Flip one agent's load up and measure until GetMetrics shows it."""
    delays = []
    async with grpc.aio.insecure_channel(f"127.0.0.1:{scaler_port}") as ch:
        stub = pb_grpc.ExternalScalerStub(ch)

        async def value(w: int) -> float:
            req = pb.GetMetricsRequest(metricName="gpuscale-gpu-utilization",
                                       scaledObjectRef=pb.ScaledObjectRef(
                                           name=f"w{w}", namespace=f"ns{w % 10}",
                                           scalerMetadata={"podSelector": f"app=w{w}"}))
            t0 = time.perf_counter()
            got = await stub.GetMetrics(req)
            latencies.append(time.perf_counter() - t0)
            return float(got.metricValues[0].metricValueFloat)

        for _ in range(n):
            node = random.randrange(controls[-1][1])
            _, _, port = next(c for c in controls if c[0] <= node < c[1])
            w = (node * PODS) % WORKLOADS
            before = await value(w)
            t0 = time.monotonic()  # before the flip: errs long, not short
            await flip(port, node)
            while abs(await value(w) - before) < 150:
                await asyncio.sleep(0.005)
            delays.append(time.monotonic() - t0)
            await asyncio.sleep(random.random())
    return delays


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--generators", type=int, default=2)
    ap.add_argument("--generate", nargs=4, type=int, help=argparse.SUPPRESS)
    ap.add_argument("--no-devices", action="store_true",
                    help="agents stream pods only (as before the operator tools)")
    args = ap.parse_args()
    if args.generate:
        await generate(*args.generate)
        return
    from bench.grpc_floor import yardstick

    stick = yardstick()  # before the generators start
    per = args.agents // args.generators
    base = 20000
    gens, controls, addrs = [], [], []
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"),
           "BENCH_FLEET_DEVICES": "0" if args.no_devices else "1"}
    for g in range(args.generators):
        first, port_base, control = g * per, base + g * per, free_port()
        p = subprocess.Popen([sys.executable, __file__, "--generate", str(first), str(per),
                              str(port_base), str(control)], stdout=subprocess.PIPE, env=env,
                             text=True)
        gens.append(p)
        controls.append((first, first + per, control))
        addrs += [f"127.0.0.1:{port_base + i}" for i in range(per)]
    for p in gens:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    sport, mport = free_port(), free_port()
    scaler = subprocess.Popen([sys.executable, "-m", "gpuscale.cli", "--log-level", "WARNING",
                               "scaler", "--host", "127.0.0.1", "--port", str(sport),
                               "--metrics-port", str(mport), "--agents", ",".join(addrs),
                               "--agents-insecure"], stdout=subprocess.PIPE, env=env, text=True)
    try:
        assert scaler.stdout is not None and "gpuscale scaler" in scaler.stdout.readline()
        url = f"http://127.0.0.1:{mport}/metrics"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            text = urllib.request.urlopen(url, timeout=10).read().decode()
            if f"gpuscale_scaler_fleet_pods {float(args.agents * PODS)}" in text:
                break
            await asyncio.sleep(1)
        # Phase 1, quiet: only the agents' updates (the scaler's ingest cost).
        before = urllib.request.urlopen(url, timeout=10).read().decode()
        cpu0, t0 = cpu_seconds(scaler.pid), time.monotonic()
        await asyncio.sleep(args.seconds)
        cpu = (cpu_seconds(scaler.pid) - cpu0) / (time.monotonic() - t0)
        rss = rss_mib(scaler.pid)
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        p50, p99, n = histogram_quantiles(text, "gpuscale_scaler_update_delay_seconds",
                                          before)
        # Phase 2: load flips probed through GetMetrics.
        latencies: list[float] = []
        delays = await probe(sport, controls, 20, latencies)
        latencies.sort()
        delays.sort()
        print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
              f"Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}")
        print(stick)
        print(f"{args.agents} agents x {PODS} pods at 1 Hz into one scaler, measured over "
              f"{args.seconds:.0f} s once all were connected")
        print(f"  update delay (histogram, {n} updates): p50 <= {p50 * 1e3:.0f} ms, "
              f"p99 <= {p99 * 1e3:.0f} ms")
        print(f"  probe: load flip -> GetMetrics changed: p50 "
              f"{delays[len(delays) // 2] * 1e3:.0f} ms, max {delays[-1] * 1e3:.0f} ms "
              f"({len(delays)} probes)")
        print(f"  scaler CPU {100 * cpu:.0f} % of one core (updates only), RSS {rss:.0f} MiB")
        print(f"  GetMetrics while probing: p50 {latencies[len(latencies) // 2] * 1e3:.2f} ms, "
              f"p99 {latencies[int(len(latencies) * 0.99) - 1] * 1e3:.2f} ms "
              f"({len(latencies)} calls)")
        from gpuscale.stream.codec import encode_report

        full = encode_report(NodeReport("node-1", 1, 0.0, 1.0, tuple(records(1))), "x" * 32,
                             time.time()).ByteSize()
        signals_only = sum(len(json.dumps(r.signals)) for r in records(1))
        print(f"  one full update: {full} bytes for {PODS} pods; signals alone (what a delta "
              f"would still carry, every signal moves every tick) ~{signals_only} bytes "
              f"as JSON")
    finally:
        scaler.terminate()
        scaler.wait(10)
        for p in gens:
            p.terminate()
            p.wait(10)


if __name__ == "__main__":
    asyncio.run(main())
