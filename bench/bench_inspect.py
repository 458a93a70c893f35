"""What the operator tools cost the scaler: the history's memory at its bounds, one
recording step, and the Inspect calls (they run on the scaler's event loop, between KEDA's
calls), at the issue's scale: 1,000 agents x 8 GPUs, 8,000 pods, 1,000 ScaledObjects.

    PYTHONPATH=src .venv/bin/python bench/bench_inspect.py [--nodes 1000] [--triggers 1000]

Prints: the time of one recording step (every ScaledObject's moment + every device's
sample), Fleet / Explain / Usage(1 h) call times (median of repeats, the reply built and
serialized as the server does), and the memory of the history filled to its bounds
(tracemalloc: 2,000 ScaledObjects x 120 moments, 20,000 devices x 61 minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import time
import tracemalloc
from typing import Any

from gpuscale.attribution.model import OwnerRef
from gpuscale.proto import inspect_pb2 as pb
from gpuscale.scaler.answers import Answers
from gpuscale.scaler.core.trigger import parse_metadata
from gpuscale.scaler.edges.inspect import Inspector
from gpuscale.scaler.edges.keda import ScalerService
from gpuscale.scaler.recorder import Recorder
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.scaler.state.history import (
    MAX_DEVICES,
    MAX_TRIGGERS,
    DeviceHistory,
    RecordedAnswers,
    TargetAnswer,
)
from gpuscale.stream.records import DeviceRecord, PodRecord


class _Ctx:
    """The little of a grpc.aio context the handlers touch on success."""

    async def abort(self, code: Any, details: str) -> None:
        raise RuntimeError(f"{code}: {details}")


def Ctx() -> Any:
    return _Ctx()


def fleet_of(nodes: int, now: float) -> FleetView:
    fleet = FleetView(stale_after=1e9)
    for n in range(nodes):
        records, devices = [], []
        for g in range(8):
            name = f"w{(n * 8 + g) % 1000}-{n}-{g}"
            records.append(PodRecord(f"ns{n % 50}", name, f"node-{n}",
                                     {"app": f"w{(n * 8 + g) % 1000}"},
                                     OwnerRef("Deployment", f"w{(n * 8 + g) % 1000}"), True,
                                     {"gpu-utilization": 50.0, "gpu-memory": 40.0,
                                      "vllm-waiting": 3.0}, now))
            devices.append(DeviceRecord(f"GPU-{n}-{g}", g, "NVIDIA H100 80GB HBM3",
                                        utilization=50.0, memory_used_mib=30000.0,
                                        memory_total_mib=81559.0,
                                        pods=(f"ns{n % 50}/{name}",)))
        fleet.update_node(f"node-{n}", records, devices)
    return fleet


def timed(fn: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--triggers", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    fleet = fleet_of(args.nodes, time.monotonic())
    service = ScalerService(Answers(fleet))
    inspector = Inspector(Recorder(service.answers, service.history))
    for i in range(args.triggers):
        md = {"podSelector": f"app=w{i}"}
        service.history.note(f"ns{i % 50}", f"so-{i}", md, parse_metadata(md), fleet.now())
    step = timed(inspector.recorder.record_now, args.repeat)
    loop = asyncio.new_event_loop()

    def call(method: Any, request: Any) -> None:
        reply = loop.run_until_complete(method(request, Ctx()))
        reply.SerializeToString()

    fleet_ms = timed(lambda: call(inspector.Fleet, pb.FleetRequest()), args.repeat)
    fleet_ns_ms = timed(lambda: call(inspector.Fleet, pb.FleetRequest(namespace="ns1")),
                        args.repeat)
    explain_ms = timed(lambda: call(inspector.Explain, pb.ExplainRequest(
        namespace="ns1", name="so-1", history=3600)), args.repeat)
    usage_ms = timed(lambda: call(inspector.Usage, pb.UsageRequest(window=3600)), 1)
    size = len(loop.run_until_complete(inspector.Fleet(pb.FleetRequest(), Ctx()))
               .SerializeToString())
    loop.close()

    # The history at its bounds, measured alone.
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    md = {"podSelector": "app=x"}
    cfg = parse_metadata(md)
    from gpuscale.scaler.state.history import TriggerHistory

    th = TriggerHistory()
    name, signal = "s0-gpuscale-gpu-utilization", "gpu-utilization"
    for i in range(MAX_TRIGGERS):
        th.note("ns", f"so-{i}", md, cfg, 0.0)
        for t in range(int(th.keep_s / th.step_s)):
            # as Inspector._moment makes them: a new TargetAnswer (a new value) every moment
            answers = (TargetAnswer(name, signal, 70.0, 5.0, 100.0 + t * 0.37 + i, "", 8, 0, 8),)
            th.record("ns", f"so-{i}", RecordedAnswers(time.time() + t * 15, answers, 8, -1, (),
                                              (), ""))
    triggers_mb = (tracemalloc.get_traced_memory()[0] - base) / 2**20
    base = tracemalloc.get_traced_memory()[0]
    dh = DeviceHistory()
    nodes = {f"n{n}": tuple(DeviceRecord(f"GPU-{n}-{g}", g, "H100", utilization=50.0,
                                         pods=(f"ns/p-{n}-{g}",)) for g in range(8))
             for n in range(MAX_DEVICES // 8)}
    for minute in range(61):
        dh.sample(minute * 60.0, nodes, [])
    devices_mb = (tracemalloc.get_traced_memory()[0] - base) / 2**20
    tracemalloc.stop()

    from bench.grpc_floor import yardstick

    print(yardstick())
    print(f"machine: {platform.machine()}, Python {platform.python_version()}; "
          f"{args.nodes} nodes x 8 GPUs, {fleet.pod_count()} pods, {args.triggers} "
          f"ScaledObjects")
    print(f"record step (all moments + device samples): {step:.1f} ms (median of "
          f"{args.repeat}; moments every 30 s in chunks of 50 ScaledObjects between loop "
          f"turns, devices every 15 s)")
    print(f"Fleet (whole fleet, {size / 2**20:.1f} MiB reply): {fleet_ms:.1f} ms; one "
          f"namespace: {fleet_ns_ms:.1f} ms")
    print(f"Explain (one ScaledObject, 1 h of moments asked): {explain_ms:.2f} ms")
    print(f"Usage (1 h, every device): {usage_ms:.1f} ms")
    print(f"history at its bounds: {MAX_TRIGGERS} ScaledObjects x "
          f"{int(th.keep_s / th.step_s)} moments = {triggers_mb:.1f} MiB; "
          f"{MAX_DEVICES} devices x 61 minutes = {devices_mb:.1f} MiB")


if __name__ == "__main__":
    main()
