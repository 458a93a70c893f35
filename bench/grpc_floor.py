"""What one KEDA call costs grpcio's Python servers, every server option side by side in one
run, and the yardstick the scaler benches print beside their figures.

Each variant serves GetMetrics in a child process (pinned to core 0 when the machine has
two or more): the same Python client (one channel, as KEDA's operator dials; pinned to the
other cores) warms it for a second, then drives it twice - a closed loop (64 calls in
flight) for calls/s and CPU per call, then paced at ``--rate`` calls/s (KEDA's rate at
1,000 ScaledObjects is ~300/s) for latency. CPU per call is the server's CPU (all threads,
from /proc) over the calls it answered, less its CPU before the calls (the 1 Hz fleet
updates of the "ours" variants).

Variants:
  aio-empty        grpc.aio server, a handler that returns a prebuilt answer: THE YARDSTICK
  aio-raw-empty    the same with bytes in and pre-serialised bytes out (no protobuf in Python)
  sync-empty       grpc.server (thread pool of 4) with the prebuilt answer
  scaler           ScalerServer + ScalerService as the scaler serves them (its server options,
                   a Prometheus counter per call), 8,000 pods updated at 1 Hz, one node per
                   turn of the event loop
  scaler-uvloop    the same on uvloop's event loop
  scaler-gcfreeze  the same with gc.freeze() after start-up (the fleet and modules frozen)
  scaler-raw       the same with GetMetrics registered as a bytes handler: our code parses
                   the request and serialises the answer (what grpc's (de)serialisers cost)
  sync-scaler      grpc.server calling ScalerService._metrics (the answer function, no async)

``keda-empty`` (not a variant of this bench's table: bench_keda.py --floor serves it) answers
every ExternalScaler method with a prebuilt answer: the floor of KEDA's call pattern, the
same client and transport with nothing behind them.

Usage: .venv/bin/python bench/grpc_floor.py [--seconds 6] [--rate 300] [--variants ...]
Other benches import ``floor()``: the yardstick measured in their own run.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import gc
import json
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import grpc  # noqa: E402

from bench.bench_fleet import free_port  # noqa: E402
from bench.bench_scaler import fleet_records, pct, pin_process  # noqa: E402
from bench.proc import child_env, proc_cpu_seconds  # noqa: E402
from gpuscale.proto import externalscaler_pb2 as pb  # noqa: E402
from gpuscale.proto import externalscaler_pb2_grpc as g  # noqa: E402

NODES, PODS, WORKLOADS, NAMESPACES = 1000, 8, 1000, 10
METHOD = "/externalscaler.ExternalScaler/GetMetrics"
VARIANTS = ("aio-empty", "aio-raw-empty", "sync-empty", "scaler", "scaler-uvloop",
            "scaler-gcfreeze", "scaler-raw", "sync-scaler")
ANSWER = pb.GetMetricsResponse(metricValues=[pb.MetricValue(
    metricName="gpuscale-gpu-utilization", metricValue=50, metricValueFloat=50.0)])


def request(w: int) -> pb.GetMetricsRequest:
    return pb.GetMetricsRequest(metricName="gpuscale-gpu-utilization",
                                scaledObjectRef=pb.ScaledObjectRef(
                                    name=f"w{w}", namespace=f"ns{w % NAMESPACES}",
                                    scalerMetadata={"podSelector": f"app=w{w}"}))


def cores() -> tuple[set[int], set[int]]:
    """(server cores, client cores): one core for the server, the rest for its client."""
    mine = sorted(os.sched_getaffinity(0))
    return ({mine[0]}, set(mine[1:])) if len(mine) > 1 else (set(mine), set(mine))


# -- the server side (a child process per variant) ----------------------------------------


def _service() -> Any:
    from prometheus_client import CollectorRegistry, Counter

    from gpuscale.scaler.answers import Answers
    from gpuscale.scaler.edges.keda import ScalerService
    from gpuscale.scaler.state.fleet import FleetView

    fleet = FleetView(stale_after=3.0)
    for n in range(NODES):
        fleet.update_node(f"node-{n}", fleet_records(n, time.monotonic()))
    registry = CollectorRegistry(auto_describe=False)
    calls = Counter("gpuscale_scaler_requests", "calls", ["method", "code"],
                    registry=registry)
    return ScalerService(Answers(fleet), count=lambda m, c: calls.labels(m, c).inc())


async def _updates(service: Any) -> None:
    """Every node once a second, one node per turn of the event loop (as the subscriber
    applies each agent's message)."""
    start = time.monotonic()
    while True:
        for n in range(NODES):
            service.fleet.update_node(f"node-{n}", fleet_records(n, time.monotonic()))
            start += 1.0 / NODES
            await asyncio.sleep(max(0.0, start - time.monotonic()))


class _Empty(g.ExternalScalerServicer):
    async def GetMetrics(self, request: Any, context: Any) -> Any:
        return ANSWER


class _KedaEmpty(g.ExternalScalerServicer):
    """Every method KEDA calls, answered with nothing computed; streams send once and
    stay open."""

    SPEC = pb.GetMetricSpecResponse(metricSpecs=[pb.MetricSpec(
        metricName="gpuscale-gpu-utilization", targetSize=60, targetSizeFloat=60.0)])

    async def GetMetricSpec(self, request: Any, context: Any) -> Any:
        return self.SPEC

    async def GetMetrics(self, request: Any, context: Any) -> Any:
        return ANSWER

    async def IsActive(self, request: Any, context: Any) -> Any:
        return pb.IsActiveResponse(result=True)

    async def StreamIsActive(self, request: Any, context: Any) -> Any:
        yield pb.IsActiveResponse(result=True)
        await asyncio.Event().wait()

    async def StreamMetricSpec(self, request: Any, context: Any) -> Any:
        yield self.SPEC
        await asyncio.Event().wait()


def _raw_handlers(answer: Any) -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler("externalscaler.ExternalScaler", {
        "GetMetrics": grpc.unary_unary_rpc_method_handler(answer)})


async def _serve_aio(variant: str, port: int, cpus: set[int]) -> None:
    from gpuscale.scaler.edges.keda import ScalerServer

    service = None
    if variant in ("aio-empty", "aio-raw-empty", "keda-empty"):
        server = grpc.aio.server(options=[  # keda-empty: room for every stream, as ours
            ("grpc.max_concurrent_streams", 2**31 - 1),
            ("grpc.server.max_pending_requests", 20_000),
            ("grpc.server.max_pending_requests_hard_limit", 40_000)]
            if variant == "keda-empty" else None)
        if variant == "aio-empty":
            g.add_ExternalScalerServicer_to_server(_Empty(), server)
        elif variant == "keda-empty":
            g.add_ExternalScalerServicer_to_server(_KedaEmpty(), server)
        else:
            frame = ANSWER.SerializeToString()

            async def raw_empty(body: bytes, context: Any) -> bytes:
                return frame

            server.add_generic_rpc_handlers((_raw_handlers(raw_empty),))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
    else:
        service = _service()
        if variant == "scaler-raw":  # the scaler's server options, GetMetrics as bytes
            async def raw(body: bytes, context: Any) -> bytes:
                req = pb.GetMetricsRequest.FromString(body)
                reply = await service.GetMetrics(req, context)
                return bytes(reply.SerializeToString())

            server = grpc.aio.server(options=ScalerServer.options(service))
            server.add_generic_rpc_handlers((_raw_handlers(raw),))
            server.add_insecure_port(f"127.0.0.1:{port}")
            await server.start()
        else:
            scaler = ScalerServer(service, host="127.0.0.1", port=port)
            await scaler.start()
        if variant == "scaler-gcfreeze":
            gc.collect()
            gc.freeze()
    pin_process(cpus)
    print("ready", flush=True)
    if service is not None:
        await _updates(service)
    await asyncio.Event().wait()


def serve(variant: str, port: int, cpus: set[int] | None = None) -> None:
    cpus = cores()[0] if cpus is None else cpus
    pin_process(cpus)
    if variant.startswith("sync"):
        if variant == "sync-empty":
            def answer(req: Any, context: Any) -> Any:
                return ANSWER
        else:
            service = _service()
            threading.Thread(target=lambda: asyncio.run(_updates(service)),
                             daemon=True).start()  # the same 1 Hz updates, on a thread

            def answer(req: Any, context: Any) -> Any:
                return service._metrics(req)
        server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=4))
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "externalscaler.ExternalScaler", {"GetMetrics": grpc.unary_unary_rpc_method_handler(
                answer, request_deserializer=pb.GetMetricsRequest.FromString,
                response_serializer=pb.GetMetricsResponse.SerializeToString)}),))
        server.add_insecure_port(f"127.0.0.1:{port}")
        server.start()
        pin_process(cpus)
        print("ready", flush=True)
        server.wait_for_termination()
        return
    if variant == "scaler-uvloop":
        import uvloop

        uvloop.run(_serve_aio(variant, port, cpus))
    else:
        asyncio.run(_serve_aio(variant, port, cpus))


# -- the driving side ---------------------------------------------------------------------


async def drive(port: int, seconds: float, rate: float, in_flight: int = 64,
                ) -> tuple[int, list[float], int]:
    """Calls on one channel for ``seconds``: closed loop with ``in_flight`` callers when
    ``rate`` is 0, else paced at ``rate`` calls/s. Returns (answered, latencies, errors)."""
    reqs = [request(w).SerializeToString() for w in range(WORKLOADS)]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call: Any = channel.unary_unary(METHOD)
        await call(reqs[0])  # connected and warm
        lat: list[float] = []
        errors = 0
        end = time.perf_counter() + seconds

        async def one(i: int) -> None:
            nonlocal errors
            t0 = time.perf_counter()
            try:
                await call(reqs[i % WORKLOADS], timeout=10)
                lat.append(time.perf_counter() - t0)
            except grpc.aio.AioRpcError:
                errors += 1

        if rate == 0:
            async def loop(k: int) -> None:
                i = k
                while time.perf_counter() < end:
                    await one(i)
                    i += in_flight
            await asyncio.gather(*(loop(k) for k in range(in_flight)))
        else:
            tasks = set()
            start, i = time.perf_counter(), 0
            while (now := time.perf_counter()) < end:
                due = start + i / rate
                if due > now:
                    await asyncio.sleep(due - now)
                task = asyncio.ensure_future(one(i))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                i += 1
            await asyncio.gather(*tasks)
        return len(lat), lat, errors


def start(variant: str) -> tuple[subprocess.Popen[str], int]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--serve", variant, str(port)],
                            stdout=subprocess.PIPE, text=True,
                            env=child_env())
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        raise RuntimeError(f"{variant} did not start")
    return proc, port


def measure(variant: str, seconds: float, rate: float) -> dict[str, float]:
    """One variant: idle CPU, closed loop, paced."""
    proc, port = start(variant)
    try:
        asyncio.run(drive(port, 1.0, 0.0))  # warm: caches filled, first calls paid
        c0, t0 = proc_cpu_seconds(proc.pid), time.monotonic()
        time.sleep(2.0)
        idle = (proc_cpu_seconds(proc.pid) - c0) / (time.monotonic() - t0)
        out: dict[str, float] = {"idle": idle}
        for label, r in (("closed", 0.0), ("paced", rate)):
            c0, t0 = proc_cpu_seconds(proc.pid), time.monotonic()
            n, lat, errors = asyncio.run(drive(port, seconds, r))
            wall, cpu = time.monotonic() - t0, proc_cpu_seconds(proc.pid) - c0
            out[f"{label}_rate"] = n / wall
            out[f"{label}_us"] = (cpu - idle * wall) / max(n, 1) * 1e6
            out[f"{label}_cpu"] = cpu / wall
            out[f"{label}_p50"], out[f"{label}_p99"] = pct(lat, 0.5), pct(lat, 0.99)
            out[f"{label}_errors"] = errors
        return out
    finally:
        proc.terminate()
        proc.wait(10)


def floor(seconds: float = 4.0) -> float:
    """The yardstick: grpc.aio's empty-handler server CPU per call (µs), closed loop on one
    channel, measured now on this machine. Other figures are printed beside it."""
    mine = os.sched_getaffinity(0)
    pin_process(cores()[1])
    try:
        return measure("aio-empty", seconds, 0.0)["closed_us"]
    finally:
        pin_process(mine)


def yardstick() -> str:
    """The line the scaler benches print beside their figures (``floor`` measured now)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # callers may run a loop
        us = pool.submit(floor).result()
    return (f"yardstick: grpc.aio empty handler {us:.0f} µs of server CPU per call "
            f"(bench/grpc_floor.py, this run; compare ratios to it across machines)")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        serve(sys.argv[2], int(sys.argv[3]),
              {int(c) for c in sys.argv[4].split(",")} if len(sys.argv) > 4 else None)
        return
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--rate", type=float, default=300.0)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--repeat", type=int, default=1,
                    help="run the whole set this many times, interleaved (noise)")
    args = ap.parse_args()
    server_cpus, client_cpus = cores()
    pin_process(client_cpus)
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, grpcio {grpc.__version__}, "
          f"{time.strftime('%Y-%m-%d')}; server on cores {sorted(server_cpus)}, client on "
          f"{sorted(client_cpus)}; closed loop 64 in flight on one channel, then "
          f"{args.rate:g} calls/s paced; {args.seconds:g} s each")
    results: dict[str, list[dict[str, float]]] = {v: [] for v in args.variants}
    for _ in range(args.repeat):
        for v in args.variants:
            results[v].append(measure(v, args.seconds, args.rate))
    floor_us = min(r["closed_us"] for r in results.get("aio-empty", [])) if results.get(
        "aio-empty") else float("nan")
    print("| variant | calls/s closed loop | server CPU per call | x yardstick | idle CPU | "
          f"paced {args.rate:g}/s: p50 / p99 | paced CPU per call | errors |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for v, runs in results.items():
        def span(key: str, fmt: str, runs: list[dict[str, float]] = runs) -> str:
            lo, hi = min(r[key] for r in runs), max(r[key] for r in runs)
            return fmt.format(lo) if lo == hi or len(runs) == 1 else (
                f"{fmt.format(lo)}-{fmt.format(hi)}")
        ratio = [r["closed_us"] / floor_us for r in runs]
        print(f"| {v} | {span('closed_rate', '{:,.0f}')} | {span('closed_us', '{:.0f}')} µs | "
              f"{min(ratio):.2f}-{max(ratio):.2f} | {span('idle', '{:.0%}')} | "
              f"{span('paced_p50', '{:.2f}')} / {span('paced_p99', '{:.2f}')} ms | "
              f"{span('paced_us', '{:.0f}')} µs | "
              f"{sum(r['closed_errors'] + r['paced_errors'] for r in runs):.0f} |")
    print(json.dumps({"floor_us": floor_us, "results": results}), file=sys.stderr)


if __name__ == "__main__":
    main()
