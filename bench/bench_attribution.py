"""Attribution cost per tick, for BENCHMARKS.md.

Two nodes: 8 H100s x 7 MIG 1g.10gb slices with 64 pods (56 slices, 8 of them shared by two
pods), and one L4 time-sliced by 48 pods. For each, per tick:
  - the rules alone (attribute(), pure);
  - the kubelet PodResources List over a real unix socket (test kubelet peer);
  - PID -> pod for every GPU process from a /proc tree;
  - rendering /metrics with the attribution;
and the sum, the agent's attribution cost per tick.

Usage: .venv/bin/python bench/bench_attribution.py [--rounds 200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402

from gpuscale.agent.exporter import SnapshotCollector  # noqa: E402
from gpuscale.attribution.cgroup import PidResolver  # noqa: E402
from gpuscale.attribution.kubelet import PodResourcesClient  # noqa: E402
from gpuscale.attribution.rules import attribute  # noqa: E402
from gpuscale.attribution.sources import ScenarioSources  # noqa: E402
from gpuscale.telemetry.scenario import parse_scenario  # noqa: E402
from gpuscale.telemetry.simulated_gpus import SimulatedBackend  # noqa: E402
from tests.peers.kubelet import KubeletPeer, pod  # noqa: E402


def mig_node() -> dict[str, Any]:
    procs = []
    for i in range(64):
        gpu, mig = (i % 56) // 7, (i % 56) % 7
        procs.append({"gpu": gpu, "mig": mig, "memory": 0.2, "load": {"constant": 30},
                      "pod": {"namespace": "bench", "name": f"pod-{i}", "container": "c"}})
    return {"nodes": [{"name": "mig", "gpus": [{"model": "H100-SXM5-80GB", "count": 8,
                                                 "sharing": "mig", "mig": ["1g.10gb"] * 7}],
                       "processes": procs}]}


def sliced_node() -> dict[str, Any]:
    procs = [{"gpu": 0, "memory_mib": 400, "load": {"constant": 2},
              "pod": {"namespace": "bench", "name": f"pod-{i}", "container": "c"}}
             for i in range(48)]
    return {"nodes": [{"name": "ts", "gpus": [{"model": "L4", "sharing": "time-sliced"}],
                       "processes": procs}]}


def pids_of(snap: Any) -> list[int]:
    return [p.pid for g in snap.gpus for p in g.processes]


async def timed(fn: Callable[[], Awaitable[object]], rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        await fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e3


async def bench(name: str, doc: dict[str, Any], rounds: int, tmp: Path) -> None:
    node = parse_scenario(doc).nodes[0]
    snap = SimulatedBackend(node).sample()
    pids = pids_of(snap)
    src = ScenarioSources(node)
    inputs = await src.gather(snap)
    assert not isinstance(inputs.allocations, tuple) or inputs.allocations

    async def rules() -> object:
        return attribute(snap, inputs.allocations, inputs.pods, inputs.owners)

    # The same allocations served by a kubelet peer on a unix socket.
    kubelet = KubeletPeer(Path(f"/tmp/gs-bench-{os.getpid()}-{len(pids)}.sock"))
    kubelet.pods = [pod(a.namespace, a.pod, (a.container, a.resource,
                                             [d.raw for d in a.devices]))
                    for a in inputs.allocations]  # type: ignore[union-attr]
    await kubelet.start()
    client = PodResourcesClient(kubelet.socket_path)

    # A /proc tree with every GPU process in its pod's cgroup.
    proc = tmp / str(len(pids))
    (proc / "1").mkdir(parents=True)
    (proc / "1" / "cgroup").write_text("0::/init.scope\n")
    for pid in pids:
        owner = inputs.owners[pid]  # type: ignore[index]
        (proc / str(pid)).mkdir()
        (proc / str(pid) / "cgroup").write_text(
            f"0::/kubepods/besteffort/pod{owner.pod_uid}/{owner.container_id}\n"
            if owner else "0::/system.slice/x.service\n")
    resolver = PidResolver(proc)

    async def owners() -> object:
        return resolver.owners(pids)

    att = await rules()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: snap, "bench",
                                        attribution=lambda: att))  # type: ignore[arg-type,return-value]

    async def render() -> object:
        return generate_latest(registry)

    try:
        t_rules = await timed(rules, rounds)
        t_list = await timed(client.list, rounds)
        t_owners = await timed(owners, rounds)
        t_render = await timed(render, max(rounds // 10, 5))
    finally:
        await client.close()
        await kubelet.stop()
    total = t_rules + t_list + t_owners
    print(f"{name}: {len(inputs.allocations)} pods, {len(pids)} GPU processes: "  # type: ignore[arg-type]
          f"rules {t_rules:.3f} ms, kubelet List {t_list:.3f} ms, /proc owners "
          f"{t_owners:.3f} ms -> {total:.2f} ms per tick; /metrics render {t_render:.2f} ms "
          f"({len(generate_latest(registry)) // 1024} KiB)")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, {time.strftime('%Y-%m-%d')} (median of "
          f"{args.rounds} rounds)")
    with tempfile.TemporaryDirectory() as d:
        await bench("8xH100 x 7 MIG, 64 pods", mig_node(), args.rounds, Path(d))
        await bench("1 L4 time-sliced by 48 pods", sliced_node(), args.rounds, Path(d))


if __name__ == "__main__":
    asyncio.run(main())
