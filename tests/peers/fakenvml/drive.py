"""Runs the NVML backend under the fake library; one command per stdin line.

Commands: ``sample`` prints the snapshot as one JSON line; ``close`` shuts NVML down and
prints ``{}``; ``gpus`` prints ``gpuscale gpus`` output as {"table": ...}; ``advance S``
moves the backend's monotonic clock on by S seconds and prints ``{}`` (only with
``--frozen-monotonic``). Arguments: ``--pcie``, ``--interval S``, ``--mig-refresh S``,
``--frozen-monotonic`` (the backend's monotonic clock stands still until ``advance``: with
the fake's ``clock_us``, a test steps both clocks instead of sleeping). Logs go to stderr.

With ``--attribute KUBELET_SOCKET PROC_ROOT KUBECONFIG NODE`` it instead runs the agent's
attribution once against those peers (waiting for the pod list) and prints
{"snapshot": ..., "attribution": ..., "signals": {"ns/pod": {signal: value}}}, the signals
being what the agent would publish for each pod.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from pathlib import Path

from gpuscale.agent.report import pod_records
from gpuscale.attribution.sources import attribute_tick, cluster_sources
from gpuscale.cli.gpus import format_gpus, snapshot_to_json
from gpuscale.telemetry.backend import GpuBackend
from gpuscale.telemetry.model import Absent
from gpuscale.telemetry.nvml import NvmlBackend


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pcie", action="store_true")
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--mig-refresh", type=float, default=30.0)
    parser.add_argument("--attribute", nargs=4, default=None)
    parser.add_argument("--frozen-monotonic", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    frozen = [1000.0]
    backend = NvmlBackend(pcie=args.pcie, interval=args.interval, node="test-node",
                          mig_refresh_s=args.mig_refresh,
                          monotonic=(lambda: frozen[0]) if args.frozen_monotonic
                          else time.monotonic)
    if args.attribute:
        print(json.dumps(asyncio.run(attribute_once(backend, *args.attribute))), flush=True)
        backend.close()
        return
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "sample":
            out = snapshot_to_json(backend.sample())
        elif cmd == "gpus":
            out = {"table": format_gpus(backend.sample())}
        elif cmd.startswith("advance ") and args.frozen_monotonic:
            frozen[0] += float(cmd.split()[1])
            out = {}
        elif cmd == "close":
            backend.close()
            out = {}
        else:
            out = {"error": f"unknown command {cmd!r}"}
        print(json.dumps(out), flush=True)
    backend.close()


async def attribute_once(backend: GpuBackend, socket: str, proc: str, kubeconfig: str,
                         node: str) -> dict[str, object]:
    sources = await cluster_sources(Path(socket), node, Path(proc), Path(kubeconfig))
    task = asyncio.create_task(sources.run())
    try:
        for _ in range(250):  # wait for the first pod list
            inputs = await sources.gather(backend.sample())
            if not isinstance(inputs.pods, Absent):
                break
            await asyncio.sleep(0.02)
        snap = backend.sample()
        att = await attribute_tick(sources, snap)
        signals = {f"{r.namespace}/{r.name}": {k: v.value if isinstance(v, Absent) else v
                                               for k, v in r.signals.items()}
                   for r in pod_records(snap, att, snap.taken_at)}
        return {"snapshot": snapshot_to_json(snap), "attribution": snapshot_to_json(att),
                "signals": signals}
    finally:
        task.cancel()
        await sources.close()


if __name__ == "__main__":
    main()
