"""What ``gpuscale top`` shows: a Fleet reply (inspect.proto) as three tables of short
cells (devices, pods, workloads), sorted and filtered.

Pure: no I/O and no terminal. The Textual app (top_app.py) and ``--once``
(``top_render.rich_tables``) lay out and draw the same rows. A reading that is absent is
the cell ``-`` with the reason in its note, never 0; a pod or node whose data is older
than its staleness bound shows ``-`` too.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from gpuscale.common.freshness import bound_of, is_stale
from gpuscale.proto import inspect_pb2 as pb
from gpuscale.proto import telemetry_pb2 as tpb
from gpuscale.scaler.core.profiles import PLANNED, SIGNALS
from gpuscale.stream.records import held_by

SORTS = ("util", "memory", "queue", "name")
QUEUE_LEGEND = "queue: w waiting, r running (vLLM); p pending (Triton); q queued, b batch (TGI)"


@dataclass(frozen=True)
class Cell:
    text: str
    note: str = ""   # why the reading is absent, or the whole text when it was shortened
    style: str = ""  # a rich style ("red", "dim"), "" for none


@dataclass(frozen=True)
class Column:
    title: str
    width: int          # the least it gets
    flex: int = 0       # share of the width left over (0: fixed)
    right: bool = False


@dataclass(frozen=True)
class Row:
    key: str
    cells: tuple[Cell, ...]

    @property
    def notes(self) -> tuple[str, ...]:
        return tuple(c.note for c in self.cells if c.note)


@dataclass(frozen=True)
class Table:
    title: str
    columns: tuple[Column, ...]
    rows: tuple[Row, ...]


@dataclass(frozen=True)
class View:
    devices: Table
    pods: Table
    workloads: Table
    summary: str
    namespaces: tuple[str, ...] = field(default=())  # every namespace in the reply
    nodes: tuple[str, ...] = field(default=())       # every node in the reply

    @property
    def tables(self) -> tuple[Table, Table, Table]:
        return self.devices, self.pods, self.workloads


DEVICE_COLUMNS = (Column("NODE", 12, 2), Column("GPU", 9), Column("MODEL", 9),
                  Column("UTIL", 4, right=True), Column("MEMORY", 11, right=True),
                  Column("PODS", 12, 3))
POD_COLUMNS = (Column("POD", 20, 3), Column("NODE", 10, 1), Column("GPU", 5, 1),
               Column("UTIL", 4, right=True), Column("MEM", 6, right=True),
               Column("QUEUE", 9, 1))
WORKLOAD_COLUMNS = (Column("SCALEDOBJECT", 18, 2), Column("SIGNAL", 14, 1),
                    Column("VALUE / TARGET", 20, 3), Column("PODS", 4, right=True),
                    Column("PLAN", 4, right=True))

# Engine queue signals, in the order the QUEUE cell shows them, with their letter.
QUEUES = (("vllm-waiting", "w"), ("vllm-running", "r"), ("triton-pending", "p"),
          ("tgi-queue", "q"), ("tgi-batch", "b"))
WAITING = ("vllm-waiting", "triton-pending", "tgi-queue")  # what --sort queue orders by


# -- reading the reply ---------------------------------------------------------------------


def filtered(reply: pb.FleetReply, namespace: str = "", node: str = "") -> pb.FleetReply:
    """``reply`` narrowed as the scaler narrows a FleetRequest: ``namespace`` keeps the
    pods and workloads of that namespace (every node stays), ``node`` keeps that node and
    its pods (workloads stay). "" keeps everything."""
    out = pb.FleetReply(now=reply.now, stale_after=reply.stale_after)
    out.nodes.extend(n for n in reply.nodes if not node or n.name == node)
    out.pods.extend(p for p in reply.pods if (not namespace or p.namespace == namespace)
                    and (not node or p.node == node))
    out.workloads.extend(w for w in reply.workloads
                         if not namespace or w.namespace == namespace)
    return out


def _number(r: tpb.Reading) -> float | None:
    return r.value if not r.absent and math.isfinite(r.value) else None


def _why(r: tpb.Reading, what: str) -> str:
    return f"{what}: {r.absent}" + (f" ({r.detail})" if r.detail else "")


def short_model(name: str) -> str:
    """"NVIDIA H100 80GB HBM3" -> "H100 80GB", "NVIDIA A100-SXM4-80GB" -> "A100 80GB"."""
    words = [w for w in re.split(r"[\s-]+", name)
             if w and w.upper() not in ("NVIDIA", "TESLA", "GEFORCE")
             and not re.fullmatch(r"(SXM|HBM|PCIE)\d*[A-Z]?", w.upper())]
    return " ".join(words[:2]) or name


def _gib(mib: float) -> str:
    return f"{mib / 1024:.1f}"


def _percent(v: float) -> str:
    return f"{v:.0f}%"


def _fmt(v: float) -> str:
    if v == 0 or 0.01 <= abs(v) < 1e6:
        return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
    return f"{v:.2e}"


# -- the three tables ----------------------------------------------------------------------


def _bound(own: float, reply: pb.FleetReply) -> float:
    """A node's or pod's staleness bound as the scaler sent it, else the reply's default;
    none known (an older scaler): nothing is called stale."""
    return bound_of(own, reply.stale_after or math.inf)


def _device_rows(reply: pb.FleetReply, sort: str) -> list[Row]:
    rows: list[Row] = []
    for node in sorted(reply.nodes, key=lambda n: n.name):
        stale = ""
        bound = _bound(node.stale_after, reply)  # its agent's own (common.freshness)
        if node.problem:
            stale = f"node {node.name}: {node.problem}"
        elif not node.connected:
            stale = f"node {node.name}: agent not connected"
        elif node.age < 0:
            stale = f"node {node.name}: no update yet"
        elif is_stale(node.age, bound):
            stale = (f"node {node.name}: stale, last update {node.age:.0f} s ago "
                     f"(bound {bound:g} s)")
        label = Cell(node.name, style="red" if stale else "")
        if stale or not node.devices:
            rows.append(Row(f"node/{node.name}", (
                label, Cell(""), Cell(""), Cell("-", stale), Cell("-", stale),
                Cell(stale.split(": ", 1)[-1] if stale else "no GPUs reported", stale,
                     "red" if stale else "dim"))))
            label = Cell("")
        gpus = [d for d in node.devices if not d.parent_uuid]
        migs: dict[str, list[tpb.Device]] = {}
        for d in node.devices:
            if d.parent_uuid:
                migs.setdefault(d.parent_uuid, []).append(d)
        orphans = [d for p, ds in migs.items() if p not in {g.uuid for g in gpus} for d in ds]
        groups = [(g, migs.get(g.uuid, [])) for g in gpus] + [(d, []) for d in orphans]
        if sort in ("util", "memory"):
            def key(d: tpb.Device) -> float:
                v = _device_key(d, sort)
                return -v if v is not None else math.inf
            groups = [(g, sorted(ms, key=key)) for g, ms in groups]
            groups.sort(key=lambda gm: min([key(gm[0])] + [key(m) for m in gm[1]]))
        for gpu, children in groups:
            for d in (gpu, *children):
                rows.append(Row(d.uuid, (label, *_device_cells(d, stale))))
                label = Cell("")
    return rows


def _device_key(d: tpb.Device, sort: str) -> float | None:
    if sort == "util":
        return _number(d.utilization)
    used, total = _number(d.memory_used), _number(d.memory_total)
    return used / total if used is not None and total else None


def _device_cells(d: tpb.Device, stale: str) -> tuple[Cell, ...]:
    if d.parent_uuid:
        gpu, model = Cell(f"{d.index} {d.model}"), Cell("MIG", style="dim")
    else:
        shared = {"time-sliced": "ts", "mps": "mps"}.get(d.sharing, "")
        gpu = Cell(f"{d.index}" + (f" {shared}" if shared else ""),
                   f"shared by {d.sharing}" if shared else "")
        model = Cell(short_model(d.model), d.model if short_model(d.model) != d.model else "")
    util_v, used, total = _number(d.utilization), _number(d.memory_used), _number(d.memory_total)
    if stale:
        util, mem = Cell("-", stale), Cell("-", stale)
    else:
        util = (Cell(_percent(util_v)) if util_v is not None
                else Cell("-", _why(d.utilization, f"{d.uuid} utilization")))
        if used is None:
            mem = Cell("-", _why(d.memory_used, f"{d.uuid} memory used"))
        elif total is None:
            mem = Cell(f"{_gib(used)}/-G", _why(d.memory_total, f"{d.uuid} memory total"))
        else:
            mem = Cell(f"{_gib(used)}/{_gib(total)}G")
    if d.pods:
        pods = Cell(", ".join(held_by(d.pods, d.claims)))
    elif d.sharing == "mig" and not d.parent_uuid:
        pods = Cell("")  # its instances say who holds them
    else:
        pods = Cell("idle", style="dim")
    return gpu, model, util, mem, pods


def _pod_key(p: pb.Pod, sort: str) -> float | None:
    if sort == "util":
        return _signal(p, "gpu-utilization")
    if sort == "memory":
        return _signal(p, "gpu-memory-used")
    got = [v for s in WAITING if (v := _signal(p, s)) is not None]
    return sum(got) if got else None


def _signal(p: pb.Pod, name: str) -> float | None:
    return _number(p.signals[name]) if name in p.signals else None


def _pod_rows(reply: pb.FleetReply, sort: str) -> list[Row]:
    held: dict[str, list[str]] = {}
    for n in reply.nodes:
        for d in n.devices:
            where = f"{d.index}:{d.model.split('.')[0]}" if d.parent_uuid else str(d.index)
            for who in d.pods:
                held.setdefault(f"{n.name}|{who}", []).append(where)
    pods = sorted(reply.pods, key=lambda p: (p.namespace, p.name))
    if sort != "name":
        def key(p: pb.Pod) -> float:
            v = _pod_key(p, sort)
            return -v if v is not None else math.inf
        pods.sort(key=key)
    rows = []
    for p in pods:
        who = f"{p.namespace}/{p.name}"
        stale = ""
        bound = _bound(p.stale_after, reply)
        if is_stale(p.age, bound):
            stale = f"{who}: stale, last record {p.age:.0f} s ago (bound {bound:g} s)"
        name = Cell(who, "" if p.ready else f"{who}: not Ready",
                    "red" if stale else "" if p.ready else "dim")
        gpus = held.get(f"{p.node}|{who}", [])
        cells = [name, Cell(p.node), Cell(",".join(gpus) or "-",
                                          "" if gpus else f"{who}: no device lists it")]
        for signal, fmt in (("gpu-utilization", _percent),
                            ("gpu-memory-used", lambda v: f"{_gib(v)}G")):
            cells.append(_reading_cell(p, signal, fmt, stale))
        cells.append(_queue_cell(p, stale))
        rows.append(Row(who, tuple(cells)))
    return rows


def _reading_cell(p: pb.Pod, signal: str, fmt: object, stale: str) -> Cell:
    if stale:
        return Cell("-", stale)
    if signal not in p.signals:
        return Cell("-", f"{p.namespace}/{p.name} {signal}: not reported")
    r = p.signals[signal]
    v = _number(r)
    if v is None:
        return Cell("-", _why(r, f"{p.namespace}/{p.name} {signal}"))
    assert callable(fmt)
    return Cell(str(fmt(v)))


def _queue_cell(p: pb.Pod, stale: str) -> Cell:
    parts, notes = [], []
    for signal, letter in QUEUES:
        if signal not in p.signals:
            continue
        r = p.signals[signal]
        v = None if stale else _number(r)
        parts.append(f"{letter}-" if v is None else f"{letter}{v:.0f}")
        if v is None:
            notes.append(stale or _why(r, f"{p.namespace}/{p.name} {signal}"))
    if "triton-queue-time" in p.signals and not stale:
        t = _number(p.signals["triton-queue-time"])
        parts.append(f"{t:.0f}ms" if t is not None else "-ms")
    return Cell(" ".join(parts), "; ".join(dict.fromkeys(notes)))


def _workload_rows(reply: pb.FleetReply) -> list[Row]:
    rows = []
    for w in sorted(reply.workloads, key=lambda w: (w.namespace, w.name)):
        name = Cell(f"{w.namespace}/{w.name}")
        plan = Cell(str(w.planned_replicas) if w.planned_replicas >= 0 else "")
        for i, a in enumerate(w.answers or [pb.Answer(unavailable="KEDA asked no metric")]):
            unit = SIGNALS[a.signal].unit if a.signal in SIGNALS else ""
            unit = {"requests": "req", "replicas": "repl"}.get(unit, unit)
            if a.unavailable:
                value = Cell(f"UNAVAILABLE {a.unavailable}", f"{name.text} {a.signal}: "
                             f"UNAVAILABLE: {a.unavailable}", "red")
            elif "/" in w.name and a.signal != PLANNED:
                # an HPA reads it (metrics API, "Kind/name"): its target is in the HPA
                value = Cell(_fmt(a.value) + (f" {unit}" if unit else ""))
            else:
                value = Cell(f"{_fmt(a.value)} / {_fmt(a.target)}"
                             + (f" {unit}" if unit else ""),
                             style="bold" if a.target and a.value > a.target else "")
            rows.append(Row(f"{w.namespace}/{w.name}/{a.metric_name or i}", (
                name if i == 0 else Cell(""), Cell(a.signal), value,
                Cell(str(w.pods) if i == 0 else ""), plan if i == 0 else Cell(""))))
    return rows


def build(reply: pb.FleetReply, sort: str = "util", namespace: str = "",
          node: str = "") -> View:
    """The view of ``reply`` narrowed to ``namespace`` and ``node`` ("" for all), pods
    sorted by ``sort`` (one of SORTS; largest first, absent readings last, then by name),
    devices by node and, for util and memory, GPUs (with their MIG instances) by it."""
    if sort not in SORTS:
        raise ValueError(f"sort: {sort!r} is not one of {', '.join(SORTS)}")
    shown = filtered(reply, namespace, node)
    devices = [d for n in shown.nodes for d in n.devices]
    gpus = sum(1 for d in devices if not d.parent_uuid)
    summary = (f"{len(shown.nodes)} nodes  {gpus} GPUs  {len(devices) - gpus} MIG/partitions  "
               f"{len(shown.pods)} pods  {len(shown.workloads)} workloads  "
               f"sort {sort}  ns {namespace or 'all'}  node {node or 'all'}")
    return View(
        Table("GPUs, MIG instances and AMD partitions", DEVICE_COLUMNS,
              tuple(_device_rows(shown, sort))),
        Table("Pods", POD_COLUMNS, tuple(_pod_rows(shown, sort))),
        Table("Workloads (ScaledObjects KEDA asked about; Kind/name: read by an HPA "
              "through the metrics API)", WORKLOAD_COLUMNS,
              tuple(_workload_rows(shown))),
        summary,
        tuple(sorted({p.namespace for p in reply.pods} | {w.namespace for w in reply.workloads})),
        tuple(sorted(n.name for n in reply.nodes)))


# -- for the live screen -------------------------------------------------------------------


def explain_row(row: Row | None) -> str:
    """What the highlighted row's cells do not show: reasons for ``-``, whole texts."""
    return " | ".join(dict.fromkeys(row.notes)) if row is not None else ""


def cycle(current: str, choices: Iterable[str]) -> str:
    """The filter after ``current``: "" (all), then each choice, then "" again."""
    options = ["", *choices]
    return options[(options.index(current) + 1) % len(options)] if current in options else ""
