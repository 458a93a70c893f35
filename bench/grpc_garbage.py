"""What one unary call leaves for Python's cyclic collector in a grpc.aio server.

A grpc.aio server (an empty GetMetrics handler, no gpuscale code) answers ``--calls``
calls from a client in the same process with the collector off; the tracked objects that
are new afterwards, by type, and what ``gc.collect()`` then frees are printed. In grpcio
1.85 every call leaves a reference cycle of five objects (the closure that
``_find_method_handler`` makes holds its own scope, and the scope the call's details and
metadata): at KEDA's 3,000 calls/s (10,000 ScaledObjects) that is 15,000 objects a second
that only the collector frees, and its young generation fills with them (bench_keda's GC
line; BENCHMARKS.md, issue 26).

Usage: .venv/bin/python bench/grpc_garbage.py [--calls 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

import grpc  # noqa: E402

from gpuscale.proto import externalscaler_pb2 as pb  # noqa: E402
from gpuscale.proto import externalscaler_pb2_grpc as pb_grpc  # noqa: E402


class _Empty(pb_grpc.ExternalScalerServicer):
    async def GetMetrics(self, request: Any, context: Any) -> Any:
        return pb.GetMetricsResponse()


def _census() -> collections.Counter[str]:
    return collections.Counter(type(o).__name__ for o in gc.get_objects())


async def main(calls: int) -> None:
    server = grpc.aio.server()
    pb_grpc.add_ExternalScalerServicer_to_server(_Empty(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.ExternalScalerStub(channel)
        request = pb.GetMetricsRequest()
        await stub.GetMetrics(request)  # connected, caches filled
        gc.collect()
        gc.disable()
        before = _census()
        for _ in range(calls):
            await stub.GetMetrics(request)
        after = _census()
        freed = gc.collect()
        gc.enable()
    await server.stop(None)
    new = {k: after[k] - before[k] for k in after if after[k] - before[k] >= calls // 2}
    print(f"grpcio {grpc.__version__}, Python {sys.version.split()[0]}: {calls:,} unary calls "
          f"left {sum(after.values()) - sum(before.values()):,} more tracked objects")
    for name, n in sorted(new.items(), key=lambda kv: -kv[1]):
        print(f"  {name}: {n:,} ({n / calls:.2f} per call)")
    print(f"gc.collect() then freed {freed:,} unreachable objects "
          f"({freed / calls:.2f} per call): reference cycles, not freed when the call ended")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=1000)
    asyncio.run(main(ap.parse_args().calls))
