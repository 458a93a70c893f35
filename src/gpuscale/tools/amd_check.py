"""A first run on an AMD node: gpuscale's readings beside ``amd-smi``'s, field by field.

No AMD hardware was available to the project: the AMD backend was written against the
``amdsmi`` package on a fake library. ``gpuscale gpus --gpu-backend amd --compare-amd-smi``
samples the node once with gpuscale and asks AMD's own tool (``amd-smi list --json`` and
``amd-smi metric --json``) right after, then lists, per processor (a GPU, or a partition
of a partitioned one), what each says and whether they agree within what the second
between the two readings can change. What it looks for in amd-smi's JSON, by key (values
plain or ``{"value": v, "unit": u}``; a top-level list, or a list under one key):
``gpu``, ``uuid``, ``bdf``, ``partition_id`` (list); ``usage.gfx_activity``,
``usage.umc_activity``, ``power.socket_power``, ``temperature.hotspot``,
``mem_usage.used_vram`` and ``total_vram`` in MB, and a partition's
``usage.gfx_busy_inst.xcp_<partition>`` (its XCCs' busy shares) (metric). A field
amd-smi does not show is reported as such - what amd-smi's output looked like is then
worth sending with the report.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuscale.common.errors import PeerError
from gpuscale.telemetry.model import Absent, GpuSample, IntReading, NodeSnapshot, Reading

MIB = 1024 * 1024
MAX_OUTPUT = 16 * MIB  # amd-smi's JSON for 64 processors is well under 1 MiB


class AmdSmiOutputError(PeerError):
    """amd-smi's output is not the JSON this check reads."""


@dataclass(frozen=True, slots=True)
class Processor:
    """One processor's readings, from either side (None: not shown there)."""

    index: int
    uuid: str | None = None
    bdf: str | None = None
    partition: int | None = None
    values: dict[str, float | str] = field(default_factory=dict)  # str: an Absent reason


# field -> (how close two readings a second apart must be, in its unit; what it means)
TOLERANCE: dict[str, tuple[float, str]] = {
    "gfx_activity": (15.0, "percentage points"),
    "umc_activity": (15.0, "percentage points"),
    "power_w": (0.15, "of the larger (relative)"),
    "hotspot_c": (3.0, "degrees C"),
    "vram_used_mib": (512.0, "MiB"),
    "vram_total_mib": (1.0, "MiB"),
    "partition_busy": (15.0, "percentage points"),
}
RELATIVE = {"power_w"}


@dataclass(frozen=True, slots=True)
class Row:
    processor: int
    what: str
    ours: str
    theirs: str
    verdict: str  # "same", "DIFFERS", "not in amd-smi", "not read by gpuscale"


def ours(snap: NodeSnapshot) -> list[Processor]:
    """gpuscale's snapshot as amd-smi numbers processors: each GPU, or each partition of a
    partitioned GPU (the GPU's activity, power and temperature on its first partition,
    as amd-smi shows them)."""
    out: list[Processor] = []
    for g in snap.gpus:
        if not g.migs:
            out.append(Processor(len(out), g.uuid, g.pci_bus_id.lower(), 0,
                                 {**_physical(g), **_vram(g.memory_used_bytes,
                                                          g.memory_total_bytes)}))
            continue
        for i, m in enumerate(g.migs):
            uuid = m.uuid if ":p" not in m.uuid else g.uuid  # a derived key: no UUID
            values = {**(_physical(g) if i == 0 else {}),
                      **_vram(m.memory_used_bytes, m.memory_total_bytes),
                      "partition_busy": _v(m.utilization_percent)}
            out.append(Processor(len(out), uuid, g.pci_bus_id.lower(), m.gpu_instance_id,
                                 values))
    return out


def _physical(g: GpuSample) -> dict[str, float | str]:
    return {"gfx_activity": _v(g.utilization_percent),
            "umc_activity": _v(g.memory_util_percent),
            "power_w": _v(g.power_watts), "hotspot_c": _v(g.temperature_c)}


def _vram(used: IntReading, total: IntReading) -> dict[str, float | str]:
    return {"vram_used_mib": _v(used, 1 / MIB), "vram_total_mib": _v(total, 1 / MIB)}


def _v(x: Reading | IntReading, scale: float = 1.0) -> float | str:
    return x.value if isinstance(x, Absent) else float(x) * scale


def theirs(listed: str, metric: str) -> list[Processor]:
    """amd-smi's processors from ``amd-smi list --json`` and ``amd-smi metric --json``.
    AmdSmiOutputError when either is not JSON of the expected shape."""
    ids = {_int(e.get("gpu"), i): e for i, e in enumerate(_entries(listed, "list"))}
    metrics = {_int(e.get("gpu"), i): e for i, e in enumerate(_entries(metric, "metric"))}
    out = []
    for index in sorted(set(ids) | set(metrics)):
        e, m = ids.get(index, {}), metrics.get(index, {})
        values: dict[str, float | str] = {}
        for name, path in (("gfx_activity", ("usage", "gfx_activity")),
                           ("umc_activity", ("usage", "umc_activity")),
                           ("power_w", ("power", "socket_power")),
                           ("hotspot_c", ("temperature", "hotspot")),
                           ("vram_used_mib", ("mem_usage", "used_vram")),  # MB: MiB
                           ("vram_total_mib", ("mem_usage", "total_vram"))):
            got = _number(_dig(m, path))
            if got is not None:
                values[name] = got
        part = _int(e.get("partition_id"), -1)
        xcp = _dig(m, ("usage", "gfx_busy_inst", f"xcp_{part}"))  # its XCCs' busy shares
        xccs = [v for v in (_number(x) for x in xcp) if v is not None and 0 <= v <= 100] \
            if isinstance(xcp, list) else []
        if xccs:
            values["partition_busy"] = sum(xccs) / len(xccs)
        uuid, bdf = e.get("uuid"), e.get("bdf")
        out.append(Processor(index, str(uuid).lower() if uuid else None,
                             str(bdf).lower() if bdf else None,
                             _int(e.get("partition_id"), -1) if "partition_id" in e else None,
                             values))
    return out


def _entries(text: str, what: str) -> list[Mapping[str, Any]]:
    if len(text) > MAX_OUTPUT:
        raise AmdSmiOutputError(f"amd-smi {what} --json printed over {MAX_OUTPUT} bytes")
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise AmdSmiOutputError(f"amd-smi {what} --json is not JSON: {exc}") from None
    if isinstance(doc, dict):  # some releases wrap the list: {"gpu_data": [...]}
        lists = [v for v in doc.values() if isinstance(v, list)]
        doc = lists[0] if len(lists) == 1 else None
    if not isinstance(doc, list) or not all(isinstance(e, dict) for e in doc):
        raise AmdSmiOutputError(f"amd-smi {what} --json is not a list of GPUs (a list of "
                                f"objects, or one under a single key)")
    return doc


def _dig(d: Mapping[str, Any], path: Sequence[str]) -> Any:
    got: Any = d
    for key in path:
        if not isinstance(got, Mapping):
            return None
        got = got.get(key)
    return got


def _number(v: Any) -> float | None:
    if isinstance(v, Mapping):
        v = v.get("value")
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return float(v)


def _int(v: Any, default: int) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else default


def compare(mine: Sequence[Processor], amd: Sequence[Processor]) -> list[Row]:
    """Every field of every processor, matched by PCI device and partition where both say
    them, else by UUID, else by position, with a verdict."""
    def place(p: Processor) -> tuple[str, int] | None:
        return (p.bdf.rsplit(".", 1)[0], p.partition) if p.bdf and p.partition is not None \
            else None

    by_place = {k: o for o in amd if (k := place(o)) is not None}
    by_uuid = {o.uuid: o for o in amd if o.uuid}
    rows: list[Row] = []
    used: set[int] = set()
    for p in mine:
        key = place(p)
        other = by_place.get(key) if key else None
        if other is None or other.index in used:
            other = by_uuid.get(p.uuid) if p.uuid else None
        if other is None or other.index in used:
            other = next((o for o in amd if o.index == p.index and o.index not in used), None)
        if other is None:
            rows.append(Row(p.index, "processor", p.uuid or "?", "-", "not in amd-smi"))
            continue
        used.add(other.index)
        rows.extend(_identity(p, other))
        rows.extend(_values(p, other))
    rows.extend(Row(o.index, "processor", "-", o.uuid or "?", "not read by gpuscale")
                for o in amd if o.index not in used)
    return rows


def _identity(p: Processor, o: Processor) -> Iterator[Row]:
    for what, a, b in (("uuid", p.uuid, o.uuid), ("pci address", p.bdf, o.bdf),
                       ("partition", p.partition, o.partition)):
        if b is None:
            yield Row(p.index, what, str(a), "-", "not in amd-smi")
        elif what == "pci address" and str(b).rsplit(".", 1)[0] == str(a).rsplit(".", 1)[0]:
            # older KFDs put a partition's ID in the function: the device is the same
            yield Row(p.index, what, str(a), str(b), "same")
        else:
            yield Row(p.index, what, str(a), str(b), "same" if a == b else "DIFFERS")


def _values(p: Processor, o: Processor) -> Iterator[Row]:
    for name, (tol, _) in TOLERANCE.items():
        a, b = p.values.get(name), o.values.get(name)
        if a is None and b is None:
            continue
        if b is None:
            yield Row(p.index, name, _show(a), "-", "not in amd-smi")
        elif a is None or isinstance(a, str):
            yield Row(p.index, name, _show(a), _show(b), "not read by gpuscale")
        else:
            gap = abs(a - float(b))
            limit = tol * max(abs(a), abs(float(b))) if name in RELATIVE else tol
            yield Row(p.index, name, _show(a), _show(b), "same" if gap <= limit else "DIFFERS")


def _show(v: float | str | None) -> str:
    if v is None:
        return "-"
    return v if isinstance(v, str) else f"{v:.6g}"


def report(rows: Sequence[Row]) -> str:
    """The rows as a table, then what to do with it."""
    width = max((len(r.ours) for r in rows), default=8)
    lines = [f"{'GPU':<5}{'FIELD':<16}{'GPUSCALE':<{width + 2}}{'AMD-SMI':<40}VERDICT"]
    lines += [f"{r.processor:<5}{r.what:<16}{r.ours:<{width + 2}}{r.theirs[:38]:<40}"
              f"{r.verdict}" for r in rows]
    bad = [r for r in rows if r.verdict == "DIFFERS"]
    absent = [r for r in rows if r.verdict.startswith("not read")]
    lines.append("")
    lines.append(f"{len(bad)} field(s) differ beyond what a second changes; "
                 f"{len(absent)} amd-smi shows that gpuscale did not read. Tolerances: "
                 + ", ".join(f"{k} {t:g} {u}" for k, (t, u) in TOLERANCE.items()) + ".")
    if bad or absent:
        lines.append("Please report them (with this output and amd-smi's JSON): a reading "
                     "gpuscale takes wrongly can scale a workload on wrong numbers.")
    return "\n".join(lines)
