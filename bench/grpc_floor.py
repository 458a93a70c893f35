"""What one call costs grpcio's Python servers on one core, with and without our handler.

A GetMetrics server pinned to core 0, for h2load (or py-spy, perf) to drive from core 1:
  aio-empty   grpc.aio server, a handler that returns a prebuilt answer (the floor)
  aio-ours    grpc.aio server, ScalerService over the bench's fleet (no 1 Hz updates)
  scaler      as bench_scaler.py serves it: counted calls, 8,000 records updated at 1 Hz
  sync-empty  grpc.server (thread pool) with the prebuilt answer
  sync-ours   grpc.server calling ScalerService._metrics (no async wrapper)

Usage (repeat per variant; the request file is one framed GetMetricsRequest, written
with ``--request FILE``):
  .venv/bin/python bench/grpc_floor.py --request /tmp/req.grpc
  taskset -c 0 .venv/bin/python bench/grpc_floor.py aio-empty 50124 &
  taskset -c 1 h2load -D 8 -c 4 -m 50 -H 'content-type: application/grpc' \
      -H 'te: trailers' -d /tmp/req.grpc \
      http://127.0.0.1:50124/externalscaler.ExternalScaler/GetMetrics
and read the server's CPU from /proc/PID/stat (utime + stime) before and after.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc
from prometheus_client import CollectorRegistry, Counter

from bench import bench_scaler as b
from gpuscale.proto import externalscaler_pb2 as pb
from gpuscale.proto import externalscaler_pb2_grpc as g
from gpuscale.scaler.answers import Answers
from gpuscale.scaler.edges.keda import ScalerServer, ScalerService
from gpuscale.scaler.state.fleet import FleetView

ANSWER = pb.GetMetricsResponse(metricValues=[pb.MetricValue(
    metricName="s0-gpuscale-gpu-utilization", metricValue=50, metricValueFloat=50.0)])


def fleet() -> FleetView:
    view = FleetView(stale_after=1e9)  # no updates in the -ours variants
    for n in range(b.NODES):
        view.update_node(f"node-{n}", b.fleet_records(n, time.monotonic()))
    return view


class Empty(g.ExternalScalerServicer):
    async def GetMetrics(self, request, context):
        return ANSWER


class SyncEmpty(g.ExternalScalerServicer):
    def GetMetrics(self, request, context):
        return ANSWER


class SyncOurs(g.ExternalScalerServicer):
    def __init__(self) -> None:
        self.service = ScalerService(Answers(fleet()))

    def GetMetrics(self, request, context):
        return self.service._metrics(request)


async def serve_aio(variant: str, port: int) -> None:
    view = fleet() if variant != "aio-empty" else None
    if variant == "scaler":
        assert view is not None
        view.stale_after = 3.0
        registry = CollectorRegistry(auto_describe=False)
        requests = Counter("gpuscale_scaler_requests", "calls", ["method", "code"],
                           registry=registry)
        service: g.ExternalScalerServicer = ScalerService(
            Answers(view), count=lambda m, c: requests.labels(m, c).inc())
        server = ScalerServer(service, host="127.0.0.1", port=port)  # type: ignore[arg-type]
        await server.start()
    else:
        service = Empty() if view is None else ScalerService(Answers(view))
        aio = grpc.aio.server(options=[("grpc.max_concurrent_streams", 1000)])
        g.add_ExternalScalerServicer_to_server(service, aio)
        aio.add_insecure_port(f"127.0.0.1:{port}")
        await aio.start()
    b.pin_process(b.SERVER_CORE)
    print("ready", flush=True)
    start = time.monotonic()
    while True:  # the scaler variant's 1 Hz updates, one node per turn (as bench_scaler)
        if variant != "scaler":
            await asyncio.sleep(3600)
            continue
        for n in range(b.NODES):
            view.update_node(f"node-{n}", b.fleet_records(n, time.monotonic()))  # type: ignore[union-attr]
            start += 1.0 / b.NODES
            await asyncio.sleep(max(0.0, start - time.monotonic()))


def main() -> None:
    if sys.argv[1] == "--request":
        w = 7
        req = pb.GetMetricsRequest(metricName="s0-gpuscale-gpu-utilization",
                                   scaledObjectRef=pb.ScaledObjectRef(
                                       name=f"w{w}", namespace=f"ns{w % b.NAMESPACES}",
                                       scalerMetadata={"podSelector": f"app=w{w}"}))
        Path(sys.argv[2]).write_bytes(b.grpc_frame(req))
        return
    variant, port = sys.argv[1], int(sys.argv[2])
    b.pin_process(b.SERVER_CORE)
    if variant.startswith("sync"):
        servicer = SyncEmpty() if variant == "sync-empty" else SyncOurs()
        server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=4),
                             options=[("grpc.max_concurrent_streams", 1000)])
        g.add_ExternalScalerServicer_to_server(servicer, server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        server.start()
        b.pin_process(b.SERVER_CORE)
        print("ready", flush=True)
        server.wait_for_termination()
    else:
        asyncio.run(serve_aio(variant, port))


if __name__ == "__main__":
    main()
