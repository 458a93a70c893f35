"""Many KEDA streams at once: 10,000 StreamIsActive / StreamMetricSpec streams against one
scaler, for BENCHMARKS.md.

The scaler runs in a child process (so its RSS and CPU are its own, read from /proc) with a
fleet view of 1,000 nodes x 8 pods (8,000 pods, 1,000 workloads in 10 namespaces) updated
at 1 Hz in-process. A client process opens ``--streams`` streams (one StreamIsActive and
one StreamMetricSpec per ScaledObject, ``--streams / 2`` ScaledObjects over the 1,000
workloads) on ONE connection, as KEDA's operator shares one per scalerAddress, all at once
(as KEDA re-opens them after a restart), and counts the pushes; from ``--settle`` seconds
on, a second client asks GetMetrics at 200 calls/s while they are open and reports its
latency; a last check opens one trigger's StreamMetricSpec twice and prints how the first
ends (a newer stream of the same trigger replaces it). Every ``--sample`` seconds: the
scaler's RSS and CPU (% of one core) over the interval.

Usage: .venv/bin/python bench/bench_streams.py [--streams 10000] [--seconds 600]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.proc import proc_cpu_seconds, proc_mem_mib  # noqa: E402

NODES, PODS_PER_NODE, WORKLOADS, NAMESPACES = 1000, 8, 1000, 10

SERVER = r"""
import asyncio, sys, time
from gpuscale.scaler.answers import Answers
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.scaler.edges.keda import ScalerServer, ScalerService
from gpuscale.stream.records import PodRecord
NODES, PODS, WORKLOADS, NS = 1000, 8, 1000, 10
def records(node, t):
    out = []
    for j in range(PODS):
        w = (node * PODS + j) % WORKLOADS
        out.append(PodRecord(f"ns{w % NS}", f"w{w}-{node}-{j}", f"node-{node}",
                             {"app": f"w{w}"}, None, True,
                             {"gpu-utilization": 50.0 + (node % 7)}, t))
    return out
async def main():
    fleet = FleetView(stale_after=3.0)
    for n in range(NODES):
        fleet.update_node(f"node-{n}", records(n, time.monotonic()))
    server = ScalerServer(ScalerService(Answers(fleet)), host="127.0.0.1", port=0)
    await server.start()
    print(server.port, flush=True)
    while True:  # every node once a second, spread over the second
        for n in range(NODES):
            fleet.update_node(f"node-{n}", records(n, time.monotonic()))
            if n % 50 == 49:
                await asyncio.sleep(0.05)
asyncio.run(main())
"""

STREAMS = r"""
import asyncio, json, sys, time
import grpc
from gpuscale.proto import externalscaler_pb2 as pb, externalscaler_pb2_grpc as g
port, streams, per = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[4])
seconds = float(sys.argv[3])
def ref(j):  # ScaledObject so-j on workload j % 1000: one stream of each kind per trigger
    w = j % 1000
    return pb.ScaledObjectRef(name=f"so-{j}", namespace=f"ns{w % 10}",
                              scalerMetadata={"podSelector": f"app=w{w}"})
async def main():
    conns = (streams + per - 1) // per
    # a distinct channel argument keeps grpc from sharing one connection between channels
    chans = [grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[("gs.conn", i)])
             for i in range(conns)]
    pushes, errors, opened = 0, {}, 0
    async def one(i):
        nonlocal pushes, opened
        stub = g.ExternalScalerStub(chans[i // per])
        call = (stub.StreamIsActive if i % 2 == 0 else stub.StreamMetricSpec)(ref(i // 2))
        opened += 1
        try:
            async for _ in call:
                pushes += 1
        except grpc.aio.AioRpcError as exc:
            kind = "IsActive" if i % 2 == 0 else "MetricSpec"
            key = f"{kind} {exc.code().name}: {(exc.details() or '')[:80]}"
            errors[key] = errors.get(key, 0) + 1
    # all at once, as KEDA re-opens every stream after a restart
    tasks = [asyncio.create_task(one(i)) for i in range(streams)]
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        await asyncio.sleep(5)
        print(json.dumps({"t": round(time.monotonic() - t0), "opened": opened,
                          "pushes": pushes, "errors": errors}), flush=True)
    for t in tasks:
        t.cancel()
asyncio.run(main())
"""

UNARY = r"""
import asyncio, json, random, sys, time
import grpc
from gpuscale.proto import externalscaler_pb2 as pb, externalscaler_pb2_grpc as g
port, seconds = int(sys.argv[1]), float(sys.argv[2])
async def main():
    ch = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[("gs.conn", "unary")])
    stub = g.ExternalScalerStub(ch)
    lat, errors = [], 0
    end = time.perf_counter() + seconds
    async def caller():
        nonlocal errors
        while time.perf_counter() < end:
            w = random.randrange(1000)
            t0 = time.perf_counter()
            try:
                await stub.GetMetrics(pb.GetMetricsRequest(
                    metricName="s0-gpuscale-gpu-utilization",
                    scaledObjectRef=pb.ScaledObjectRef(name=f"w{w}", namespace=f"ns{w % 10}",
                        scalerMetadata={"podSelector": f"app=w{w}"})))
                lat.append(time.perf_counter() - t0)
            except grpc.aio.AioRpcError:
                errors += 1
            await asyncio.sleep(max(0.0, 0.2 - (time.perf_counter() - t0)))
    await asyncio.gather(*(caller() for _ in range(40)))  # 40 callers x 5/s = 200 calls/s
    lat.sort()
    q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] * 1e3
    print(json.dumps({"calls": len(lat), "p50": q(0.5), "p99": q(0.99), "errors": errors}))
asyncio.run(main())
"""

REPLACE = r"""
import asyncio, sys
import grpc
from gpuscale.proto import externalscaler_pb2 as pb, externalscaler_pb2_grpc as g
port = int(sys.argv[1])
async def main():
    ch = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[("gs.conn", "replace")])
    stub = g.ExternalScalerStub(ch)
    ref = pb.ScaledObjectRef(name="w1", namespace="ns1", scalerMetadata={"podSelector": "app=w1"})
    old = stub.StreamMetricSpec(ref)
    await old.read()
    new = stub.StreamMetricSpec(ref)
    await new.read()
    try:
        await old.read()
        print("the first stream is still open")
    except grpc.aio.AioRpcError as exc:
        print(f"the first ended with {exc.code().name}: {exc.details()}; the second is open")
    new.cancel()
asyncio.run(main())
"""


def proc_stat(pid: int) -> tuple[float, float]:
    """(RSS MiB, CPU seconds) of ``pid``."""
    return proc_mem_mib(pid)[0], proc_cpu_seconds(pid)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--sample", type=float, default=60.0)
    parser.add_argument("--per-connection", type=int, default=0,
                        help="streams per connection (0: all on one, as KEDA opens them)")
    parser.add_argument("--settle", type=float, default=30.0,
                        help="seconds for the streams to open before GetMetrics is measured")
    args = parser.parse_args()
    if args.settle >= args.seconds:
        parser.error("--settle must be shorter than --seconds (GetMetrics is measured after "
                     "the streams settle, while they stay open)")
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}")
    from bench.grpc_floor import yardstick

    print(yardstick())
    server = await asyncio.create_subprocess_exec(sys.executable, "-c", SERVER,
                                                  stdout=asyncio.subprocess.PIPE, env=env)
    assert server.stdout is not None
    port = int((await server.stdout.readline()).decode())
    try:
        rss0, _ = proc_stat(server.pid)
        base = await asyncio.create_subprocess_exec(
            sys.executable, "-c", UNARY, str(port), "20", stdout=asyncio.subprocess.PIPE,
            env=env)
        cpu_a = proc_stat(server.pid)[1]
        out, _ = await base.communicate()
        cpu_b = proc_stat(server.pid)[1]
        print(f"before any stream: RSS {rss0:.0f} MiB; GetMetrics at 200 calls/s for 20 s: "
              f"{out.decode().strip()}; scaler CPU {100 * (cpu_b - cpu_a) / 20:.0f} % of a core")
        streams = await asyncio.create_subprocess_exec(
            sys.executable, "-c", STREAMS, str(port), str(args.streams), str(args.seconds),
            str(args.per_connection or args.streams), stdout=asyncio.subprocess.PIPE,
            env=env)
        assert streams.stdout is not None
        t0 = time.monotonic()
        unary = None
        last_cpu, last_t = proc_stat(server.pid)[1], t0
        next_sample = t0 + args.sample
        line = b""
        while True:
            try:
                line = await asyncio.wait_for(streams.stdout.readline(), 1.0)
            except TimeoutError:
                line = b"..."
            if not line:
                break
            now = time.monotonic()
            if unary is None and now - t0 >= args.settle:  # the streams are open: measure
                unary = await asyncio.create_subprocess_exec(
                    sys.executable, "-c", UNARY, str(port), str(args.seconds - args.settle),
                    stdout=asyncio.subprocess.PIPE, env=env)
            if now >= next_sample:
                rss, cpu = proc_stat(server.pid)
                status = line.decode().strip() if line != b"..." else ""
                print(f"  t={now - t0:4.0f}s scaler RSS {rss:.0f} MiB, CPU "
                      f"{100 * (cpu - last_cpu) / (now - last_t):.0f} % of a core; {status}",
                      flush=True)
                last_cpu, last_t, next_sample = cpu, now, next_sample + args.sample
        assert unary is not None
        out, _ = await unary.communicate()
        print(f"GetMetrics at 200 calls/s with the streams open (from t={args.settle:.0f}s "
              f"on): {out.decode().strip()}")
        again = await asyncio.create_subprocess_exec(
            sys.executable, "-c", REPLACE, str(port), stdout=asyncio.subprocess.PIPE,
            env=env)
        out, _ = await again.communicate()
        print(f"one trigger's StreamMetricSpec opened twice: {out.decode().strip()}")
    finally:
        server.kill()
        await server.wait()


if __name__ == "__main__":
    asyncio.run(main())
