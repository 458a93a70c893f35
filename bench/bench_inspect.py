"""What the operator tools cost the scaler: the history's memory at its bounds, one
recording step, and the Inspect calls (they run on the scaler's event loop, between KEDA's
calls), at the issue's scale: 1,000 agents x 8 GPUs, 8,000 pods, 1,000 ScaledObjects.

    .venv/bin/python bench/bench_inspect.py [--nodes 1000] [--triggers 1000]

The fleet is fed as a scaler's is: each node's update encoded, parsed from its bytes and
decoded (``decode_report``), so its devices stay undecoded until something reads them
(``WireDevices``) - as after every agent's device update. Prints: the time of one
recording step (every ScaledObject's moment + every device's sample) and of Fleet, each
right after every node's update (the devices decoded inside) and again (already decoded);
Explain / Usage(1 h) call times (median of repeats, the reply built and serialized as the
server does); and the memory of the history filled to its bounds (tracemalloc: 2,000
ScaledObjects x 120 moments, 20,000 devices x 61 minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO))

from bench.grpc_floor import yardstick  # noqa: E402
from gpuscale.attribution.model import OwnerRef  # noqa: E402
from gpuscale.proto import inspect_pb2 as pb  # noqa: E402
from gpuscale.proto import telemetry_pb2 as tpb  # noqa: E402
from gpuscale.scaler.answers import Answers  # noqa: E402
from gpuscale.scaler.core.trigger import parse_metadata  # noqa: E402
from gpuscale.scaler.edges.inspect import Inspector  # noqa: E402
from gpuscale.scaler.edges.keda import ScalerService  # noqa: E402
from gpuscale.scaler.recorder import Recorder  # noqa: E402
from gpuscale.scaler.state.fleet import FleetView  # noqa: E402
from gpuscale.scaler.state.history import (  # noqa: E402
    MAX_DEVICES,
    MAX_TRIGGERS,
    DeviceHistory,
    RecordedAnswers,
    TargetAnswer,
)
from gpuscale.stream.codec import decode_report, encode_report  # noqa: E402
from gpuscale.stream.records import DeviceRecord, NodeReport, PodRecord, deliver  # noqa: E402


class _Ctx:
    """The little of a grpc.aio context the handlers touch on success."""

    async def abort(self, code: Any, details: str) -> None:
        raise RuntimeError(f"{code}: {details}")


def Ctx() -> Any:
    return _Ctx()


def updates(nodes: int, now: float) -> list[bytes]:
    """Every node's update as its agent sends it: 8 pods and their 8 GPUs, encoded."""
    out = []
    for n in range(nodes):
        records, devices = [], []
        for g in range(8):
            # workload w's 8 pods, on 8 nodes, in the namespace of its ScaledObject so-w
            w = (n * 8 + g) % 1000
            name = f"w{w}-{n}-{g}"
            records.append(PodRecord(f"ns{w % 50}", name, f"node-{n}", {"app": f"w{w}"},
                                     OwnerRef("Deployment", f"w{w}"), True,
                                     {"gpu-utilization": 50.0, "gpu-memory": 40.0,
                                      "vllm-waiting": 3.0}, now))
            devices.append(DeviceRecord(f"GPU-{n}-{g}", g, "NVIDIA H100 80GB HBM3",
                                        utilization=50.0, memory_used_mib=30000.0,
                                        memory_total_mib=81559.0,
                                        pods=(f"ns{w % 50}/{name}",)))
        report = NodeReport(f"node-{n}", 1, now, 1.0, tuple(records), tuple(devices))
        out.append(encode_report(report, "a" * 32, 0.0).SerializeToString())
    return out


def ingest(fleet: FleetView, wires: list[bytes]) -> None:
    """Every node's update received: parsed from its bytes, decoded, delivered."""
    now = time.monotonic()
    for n, raw in enumerate(wires):
        deliver(decode_report(tpb.NodeUpdate.FromString(raw), now, 1e9), fleet,
                f"node-{n}")  # (never stale: the timings are of answers over live pods)


def fresh(fn: Callable[[], object], before: Callable[[], object], repeat: int) -> float:
    """Median ms of ``fn`` with ``before`` run (untimed) ahead of each call."""
    times = []
    for _ in range(repeat):
        before()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


def timed(fn: Callable[[], object], repeat: int) -> float:
    """Median ms of ``fn``."""
    return fresh(fn, lambda: None, repeat)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--triggers", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    wires = updates(args.nodes, time.monotonic())
    fleet = FleetView(stale_after=1e9)
    ingest(fleet, wires)
    service = ScalerService(Answers(fleet))
    inspector = Inspector(Recorder(service.answers, service.history))
    for i in range(args.triggers):
        md = {"podSelector": f"app=w{i}"}
        service.history.note(f"ns{i % 50}", f"so-{i}", md, parse_metadata(md), fleet.now())

    def again() -> None:
        ingest(fleet, wires)

    step_fresh = fresh(inspector.recorder.record_now, again, args.repeat)
    step = timed(inspector.recorder.record_now, args.repeat)
    loop = asyncio.new_event_loop()

    def call(method: Any, request: Any) -> None:
        reply = loop.run_until_complete(method(request, Ctx()))
        reply.SerializeToString()

    fleet_fresh = fresh(lambda: call(inspector.Fleet, pb.FleetRequest()), again, args.repeat)
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

    print(yardstick())
    print(f"machine: {platform.machine()}, Python {platform.python_version()}; "
          f"{args.nodes} nodes x 8 GPUs, {fleet.pod_count()} pods, {args.triggers} "
          f"ScaledObjects")
    print(f"record step (all moments + device samples): {step_fresh:.1f} ms right after "
          f"every node's update, {step:.1f} ms again (median of {args.repeat}; moments "
          f"every 30 s in chunks of 50 ScaledObjects between loop turns, devices every "
          f"15 s, 50 nodes a turn)")
    print(f"Fleet (whole fleet, {size / 2**20:.1f} MiB reply): {fleet_fresh:.1f} ms right "
          f"after every node's update, {fleet_ms:.1f} ms again (in chunks of 50 nodes / "
          f"500 pods between loop turns); one namespace: {fleet_ns_ms:.1f} ms")
    print(f"Explain (one ScaledObject, 1 h of moments asked): {explain_ms:.2f} ms")
    print(f"Usage (1 h, every device): {usage_ms:.1f} ms")
    print(f"history at its bounds: {MAX_TRIGGERS} ScaledObjects x "
          f"{int(th.keep_s / th.step_s)} moments = {triggers_mb:.1f} MiB; "
          f"{MAX_DEVICES} devices x 61 minutes = {devices_mb:.1f} MiB")


if __name__ == "__main__":
    main()
