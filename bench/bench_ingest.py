"""What one second of fleet ingestion leaves for the scaler's cyclic collector.

Every agent sends its node's pods each second and its GPUs every DEVICES_EVERY_S (the
publisher's cadence; 8 pods, 8 GPUs here, phases spread over the nodes); the scaler
decodes each update (``stream.codec.decode_report``) and hands it to its fleet view
(``FleetView.update_node``), as ``AgentLink`` does. The records a round makes stay alive
until the node's next update, so when grpcio's per-call garbage (``grpc_garbage.py``)
triggers a young collection, the collector walks the newest round's tracked objects as
well - the pause every KEDA call behind it waits out (BENCHMARKS.md, issue 26). Printed:
the tracked objects one round of ``--nodes`` updates leaves young, by type; the young
collection's time with them (after a full collection, so nothing else is young); and the
CPU per update, beside a yardstick measured in the same run - parsing the same update's
bytes (protobuf's C parser): a rerun on another machine compares the ratio.

Usage: .venv/bin/python bench/bench_ingest.py [--nodes 1000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import collections
import gc
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO))

from bench.bench_fleet import PODS, devices, records  # noqa: E402
from gpuscale.proto import telemetry_pb2 as pb  # noqa: E402
from gpuscale.scaler.state.fleet import FleetView  # noqa: E402
from gpuscale.stream.codec import decode_report, encode_report  # noqa: E402
from gpuscale.stream.publisher import DEVICES_EVERY_S  # noqa: E402
from gpuscale.stream.records import NodeReport, deliver  # noqa: E402


def update(node: int, seq: int, with_devices: bool) -> bytes:
    """Node ``node``'s update number ``seq`` as bench_fleet's generator makes it (its pods
    owned by a ReplicaSet, as a real agent's are)."""
    pods = tuple(records(node))
    report = NodeReport(f"node-{node}", seq, 0.0, 1.0, pods,
                        tuple(devices(node, list(pods))) if with_devices else None)
    return encode_report(report, "a" * 32, 0.0).SerializeToString()


def best_per_node(fn: Callable[[], object], nodes: int, repeat: int = 15) -> float:
    """µs per node, the best of ``repeat`` whole rounds (the collector off)."""
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best / nodes * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    every = round(DEVICES_EVERY_S)  # an agent's updates per device news (1 s ticks)
    wires = [[update(n, seq, (n + seq) % every == 0) for n in range(args.nodes)]
             for seq in range(every)]
    fleet = FleetView(stale_after=1e9)
    sources = [f"10.0.{n // 250}.{n % 250}:9400" for n in range(args.nodes)]

    def ingest(seq: int) -> None:
        now = time.monotonic()
        for source, raw in zip(sources, wires[seq % len(wires)], strict=True):
            msg = pb.NodeUpdate.FromString(raw)
            deliver(decode_report(msg, now, 3.0), fleet, source)

    gc.disable()
    for seq in range(len(wires)):  # every pod and device known, every cache warm
        ingest(seq)
    young, pauses = [], []
    kinds: collections.Counter[str] = collections.Counter()
    for seq in range(args.rounds):
        gc.collect()  # the fleet so far is old; only this round's objects will be young
        ingest(seq)
        objects = gc.get_objects(generation=0)
        young.append(len(objects))
        kinds = collections.Counter(type(o).__name__ for o in objects)
        del objects
        t = time.perf_counter()
        gc.collect(0)
        pauses.append(time.perf_counter() - t)
    parse = best_per_node(lambda: [pb.NodeUpdate.FromString(r) for r in wires[0]],
                          args.nodes)
    whole = best_per_node(lambda: ingest(0), args.nodes)
    gc.enable()
    print(f"machine: {platform.machine()}, Python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d')}")
    print(f"{args.nodes:,} nodes x {PODS} pods and {PODS} GPUs, one update each, "
          f"devices on one in {every} ({len(wires[0][0]):,} bytes with them, "
          f"{len(wires[0][1]):,} without):")
    print(f"  tracked objects left young: {statistics.median(young):,.0f} "
          f"({statistics.median(young) / args.nodes:.1f} per update): "
          + ", ".join(f"{k} {v:,}" for k, v in kinds.most_common(6)))
    print(f"  young collection with them: {statistics.median(pauses) * 1e3:.1f} ms "
          f"(median of {args.rounds})")
    print(f"  decode + apply: {whole:.1f} µs per update = {whole / parse:.1f}x the yardstick "
          f"(parsing its bytes: {parse:.1f} µs)")


if __name__ == "__main__":
    main()
