"""``gpuscale gpus``: this node's GPUs, MIG instances and processes, one reading."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import asdict
from enum import Enum
from typing import Any

from gpuscale.attribution.model import NodeAttribution
from gpuscale.attribution.sources import attribute_tick
from gpuscale.cli.backend import add_backend_args, make_backend, make_sources
from gpuscale.cli.common import add_client_tls_args, fail, tls_files
from gpuscale.common.errors import ConfigError, GpuscaleError, Unavailable
from gpuscale.stream.records import DeviceRecord, NodeReport
from gpuscale.stream.subscriber import read_node
from gpuscale.stream.tls import DEFAULT_SERVER_NAME, channel_credentials
from gpuscale.telemetry.model import Absent, BackendState, NodeSnapshot
from gpuscale.tools import amd_check

AMD_SMI_TIMEOUT_S = 60.0  # amd-smi metric on 64 partitions takes seconds, not minutes


def add_parser(sub: Any) -> None:
    gpus = sub.add_parser("gpus", help="show this node's GPUs, MIG instances and processes "
                                       "(or what a running agent reads: --agent)")
    add_backend_args(gpus)
    gpus.add_argument("--json", action="store_true", help="print the snapshot as JSON")
    gpus.add_argument("--compare-amd-smi", action="store_true",
                      help="AMD nodes, first run: read the GPUs once and compare each reading "
                           "with what amd-smi (list, metric --json) says right after; exit 1 "
                           "if any differs (docs/amd.md)")
    gpus.add_argument("--amd-smi", default="amd-smi", metavar="PATH",
                      help="the amd-smi command for --compare-amd-smi (default: amd-smi on "
                           "PATH, else $ROCM_PATH/bin/amd-smi)")
    a = gpus.add_argument_group("a running agent instead of this node's GPUs")
    a.add_argument("--agent", metavar="HOST:PORT",
                   help="read the agent's telemetry stream (its --stream-port; demo --scenario "
                        "prints it) and show its node's GPUs, MIG instances and pods as "
                        "the agent reads them: the numbers the scaler gets")
    add_client_tls_args(a, "--agent-tls", "an agent", DEFAULT_SERVER_NAME)
    gpus.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.agent:
        return _from_agent(args)
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
    if args.compare_amd_smi:
        return _compare_amd_smi(args, snap)
    if args.json:
        out = snapshot_to_json(snap)
        out["attribution"] = snapshot_to_json(att) if att is not None else None
        print(json.dumps(out, indent=2))
    else:
        print(format_gpus(snap, att))
    return 0 if snap.state is BackendState.OK else 1


def _compare_amd_smi(args: argparse.Namespace, snap: NodeSnapshot) -> int:
    if snap.backend != "amdsmi":
        return fail(f"--compare-amd-smi compares the AMD backend's readings: this run read "
                    f"{snap.backend} (add --gpu-backend amd)")
    if snap.state is not BackendState.OK:
        return fail(f"the AMD backend could not read this node: {snap.reason}", code=1)
    tool = shutil.which(args.amd_smi) or shutil.which(
        os.path.join(os.environ.get("ROCM_PATH", "/opt/rocm"), "bin", "amd-smi"))
    if tool is None:
        return fail(f"{args.amd_smi!r} not found (install amd-smi, ROCm's amd-smi-lib, or "
                    f"give --amd-smi PATH)")
    outputs = []
    for command in ("list", "metric"):
        try:
            got = subprocess.run([tool, command, "--json"], capture_output=True, text=True,
                                 timeout=AMD_SMI_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return fail(f"amd-smi {command} --json: {exc}", code=1)
        if got.returncode != 0:
            return fail(f"amd-smi {command} --json exited {got.returncode}: "
                        f"{got.stderr.strip()[:300]}", code=1)
        outputs.append(got.stdout)
    try:
        rows = amd_check.compare(amd_check.ours(snap), amd_check.theirs(*outputs))
    except amd_check.AmdSmiOutputError as exc:
        return fail(exc)
    print(amd_check.report(rows))
    return 1 if any(r.verdict == "DIFFERS" for r in rows) else 0


def _from_agent(args: argparse.Namespace) -> int:
    try:
        files = tls_files(args.agent_tls_cert, args.agent_tls_key, args.agent_tls_ca)
    except ValueError as exc:
        return fail(str(exc))
    credentials = channel_credentials(files) if files is not None else (lambda: None)
    try:
        report = asyncio.run(read_node(args.agent, credentials, args.agent_tls_server_name))
    except GpuscaleError as exc:
        return fail(exc)
    if args.json:
        print(json.dumps(snapshot_to_json(report), indent=2, default=str))
    else:
        print(format_report(report, args.agent))
    return 0


def format_report(report: NodeReport, address: str) -> str:
    """A node as its agent's stream shows it: each GPU and MIG instance with its use and
    holders, then each pod with its signals (Absent ones with their reason)."""
    gib = 1 / 1024
    lines = [f"node {report.node}  (agent {address}, update {report.seq}, every "
             f"{report.interval:g}s)",
             f"{'GPU':<4}{'NAME / PROFILE':<28}{'SHARING':<14}{'UTIL':>12}{'MEMORY':>20}"
             f"  HELD BY"]
    devices = report.devices or ()
    for d in devices:
        mem = f"{_fmt(d.memory_used_mib, '', gib, 1)}/{_fmt(d.memory_total_mib, '', gib, 1)}G"
        name = d.model if not d.parent_uuid else f"  {d.model}"
        lines.append(f"{d.index:<4}{name[:27]:<28}{d.sharing[:13]:<14}"
                     f"{_fmt(d.utilization, '%'):>12}{mem:>20}  "
                     f"{', '.join(d.holders()) or _unheld(d, devices)}")
    assert not isinstance(report.pods, Unavailable)  # read_node raises for those
    for p in report.pods:
        signals = ", ".join(
            f"{k} {v:.6g}" if not isinstance(v, Absent) else
            f"{k} {v.value}" + (f" ({p.reasons[k]})" if k in p.reasons else "")
            for k, v in sorted(p.signals.items()))
        lines.append(f"pod {p.namespace}/{p.name}{'' if p.ready else ' (not Ready)'}: "
                     f"{signals or 'no signals'}")
    return "\n".join(lines)


def _unheld(device: DeviceRecord, devices: Sequence[DeviceRecord]) -> str:
    """What a device no pod holds is doing: a GPU split into MIG instances is held through
    its instances (pods hold those, never the parent), so it says how many are in use."""
    slices = [d for d in devices if d.parent_uuid == device.uuid]
    if device.parent_uuid or (device.sharing != "mig" and not slices):
        return "idle"
    used = sum(1 for d in slices if d.pods)
    return f"MIG: {used} of {len(slices)} instances in use"


def snapshot_to_json(snap: NodeSnapshot | NodeAttribution | NodeReport) -> dict[str, Any]:
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
    """Device UUID -> "ns/pod/container, ..." for the table (with its claim when the
    device is a DRA claim's)."""
    out: dict[str, list[str]] = {}
    for p in att.pods if att is not None else ():
        for d in p.devices:
            who = f"{p.namespace}/{p.pod}/{p.container}" + (
                f" (claim {d.device.claim.partition('/')[2]})" if d.device.claim else "")
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
            name = f"  {m.device_id}" if m.device_id else ""  # the device plugin's (AMD)
            lines.append(f"{'':<4}{m.gpu_instance_id:<5}{m.profile:<24}"
                         f"{_fmt(m.utilization_percent, '%'):>12}{mmem:>20}{'':>8}  {m.uuid}"
                         + name + (f"  <- {owners[m.uuid]}" if m.uuid in owners else ""))
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
