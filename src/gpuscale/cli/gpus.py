"""``gpuscale gpus``: this node's GPUs, MIG instances and processes, one reading."""

from __future__ import annotations

import argparse
import asyncio
import json
from dataclasses import asdict
from enum import Enum
from typing import Any

from gpuscale.attribution.model import NodeAttribution
from gpuscale.attribution.sources import attribute_tick
from gpuscale.cli.backend import add_backend_args, make_backend, make_sources
from gpuscale.cli.common import fail
from gpuscale.common.errors import ConfigError
from gpuscale.telemetry.model import Absent, BackendState, NodeSnapshot


def add_parser(sub: Any) -> None:
    gpus = sub.add_parser("gpus", help="show this node's GPUs, MIG instances and processes")
    add_backend_args(gpus)
    gpus.add_argument("--json", action="store_true", help="print the snapshot as JSON")
    gpus.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        backend = make_backend(args)
    except ConfigError as exc:
        return fail(exc)

    async def one_tick() -> tuple[NodeSnapshot, NodeAttribution | None]:
        sources = await make_sources(args, backend, watch_pods=False)
        try:
            snap = backend.sample()
            return snap, (await attribute_tick(sources, snap) if sources else None)
        finally:
            backend.close()
            if sources is not None:
                await sources.close()

    try:
        snap, att = asyncio.run(one_tick())
    except ConfigError as exc:
        return fail(exc)
    if args.json:
        out = snapshot_to_json(snap)
        out["attribution"] = snapshot_to_json(att) if att is not None else None
        print(json.dumps(out, indent=2))
    else:
        print(format_gpus(snap, att))
    return 0 if snap.state is BackendState.OK else 1


def snapshot_to_json(snap: NodeSnapshot | NodeAttribution) -> dict[str, Any]:
    def clean(v: Any) -> Any:
        if isinstance(v, Enum):
            return v.value
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [clean(x) for x in v]
        return v

    result: dict[str, Any] = clean(asdict(snap))
    return result


def _fmt(v: float | Absent, unit: str = "", scale: float = 1.0, digits: int = 0) -> str:
    if isinstance(v, Absent):
        return v.value
    return f"{v * scale:.{digits}f}{unit}"


def _holders(att: NodeAttribution | None) -> dict[str, str]:
    """Device UUID -> "ns/pod/container, ..." for the table."""
    out: dict[str, list[str]] = {}
    for p in att.pods if att is not None else ():
        for d in p.devices:
            who = f"{p.namespace}/{p.pod}/{p.container}"
            out.setdefault(d.mig_uuid or d.gpu_uuid, []).append(who)
    return {k: ", ".join(v) for k, v in out.items()}


def format_gpus(snap: NodeSnapshot, att: NodeAttribution | None = None) -> str:
    """The node's GPUs, MIG instances and processes, and who holds each, as a table."""
    if snap.state is not BackendState.OK:
        return f"{snap.node}: GPU backend {snap.backend} unavailable: {snap.reason}"
    owners = _holders(att)
    gib = 1 / 1024**3
    lines = [f"node {snap.node}  backend {snap.backend}  driver {snap.driver_version}  "
             f"{len(snap.gpus)} GPUs",
             f"{'GPU':<4}{'MIG':<5}{'NAME / PROFILE':<24}{'UTIL':>12}{'MEMORY':>20}"
             f"{'POWER':>8}  UUID"]
    for g in snap.gpus:
        mem = f"{_fmt(g.memory_used_bytes, '', gib, 1)}/{_fmt(g.memory_total_bytes, '', gib, 1)}G"
        lines.append(f"{g.index:<4}{'-':<5}{g.name[:23]:<24}"
                     f"{_fmt(g.utilization_percent, '%'):>12}{mem:>20}"
                     f"{_fmt(g.power_watts, 'W'):>8}  {g.uuid}"
                     + ("" if g.state.value == "ok" else f"  [{g.state.value}]")
                     + (f"  <- {owners[g.uuid]}" if g.uuid in owners else ""))
        for m in g.migs:
            mmem = (f"{_fmt(m.memory_used_bytes, '', gib, 1)}/"
                    f"{_fmt(m.memory_total_bytes, '', gib, 1)}G")
            lines.append(f"{'':<4}{m.gpu_instance_id:<5}{m.profile:<24}"
                         f"{_fmt(m.utilization_percent, '%'):>12}{mmem:>20}{'':>8}  {m.uuid}"
                         + (f"  <- {owners[m.uuid]}" if m.uuid in owners else ""))
        for p in g.processes:
            gi = "" if p.gpu_instance_id is None else str(p.gpu_instance_id)
            lines.append(f"{'':<4}{gi:<5}{'  pid ' + str(p.pid):<24}"
                         f"{_fmt(p.sm_util_percent, '%'):>12}"
                         f"{_fmt(p.used_memory_bytes, 'G', gib, 1):>20}")
    for problem in snap.problems:
        lines.append(f"! {problem}")
    if att is not None:
        lines.append(f"attribution: {att.state.value}"
                     + (f" ({'; '.join(att.reasons)})" if att.reasons else ""))
        for o in att.unattributed:
            lines.append(f"! pid {o.pid} on {o.gpu_uuid}: {o.reason}")
    return "\n".join(lines)
