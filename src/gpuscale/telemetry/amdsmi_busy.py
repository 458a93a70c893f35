"""A partition's GFX busy share from the GPU metrics table (``amdsmi_gpu_metrics_t``): the
table's per-partition, per-XCC figures read through the ``amdsmi`` package's own C binding,
and the share made of them (pure). The GPU's activity (``amdsmi_get_gpu_activity``) is the
average over all its partitions on every partition's handle: never a partition's own."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from gpuscale.telemetry.amdsmi_values import U64_NA
from gpuscale.telemetry.model import Absent


@dataclass(frozen=True, slots=True)
class BusyTable:
    """The GPU metrics table's busy figures, per partition and XCC: the instantaneous
    shares, and the accumulated ones with the table's accumulation counter; and how many
    partitions the table says the GPU has now (``num_partition``; 0 when not filled)."""

    inst: list[list[int]]
    acc: list[list[int]]
    counter: int
    partitions: int = 0


def gfx_busy(handle: Any, smi: ModuleType) -> BusyTable:
    """The busy figures of the GPU metrics table: the package's own C binding and
    structure (amdsmi_wrapper), read directly - its Python interface turns all 77 fields
    into a dict each call, 2 ms of CPU a node of 8 GPUs for the few fields used. A failed
    call raises as the interface would."""
    wrapper = smi.amdsmi_interface.amdsmi_wrapper
    table = wrapper.amdsmi_gpu_metrics_t()
    status = wrapper.amdsmi_get_gpu_metrics_info(handle, ctypes.byref(table))
    if status != 0:
        raise smi.AmdSmiLibraryException(status)
    parts = int(getattr(table, "num_partition", 0))
    return BusyTable([list(x.gfx_busy_inst) for x in table.xcp_stats],
                     [list(x.gfx_busy_acc) for x in table.xcp_stats],
                     int(table.accumulation_counter),
                     parts if 0 < parts <= len(table.xcp_stats) else 0)


def xcp_busy(busy: BusyTable | Absent, last: BusyTable | None, pid: int) -> float | Absent:
    """A partition's GFX busy share from the metrics table: the mean over the XCCs it holds
    (entries the library marks N/A are XCCs it does not hold) of the instantaneous share,
    or of the share accumulated since the last tick where the table accumulates it, which
    ever is larger - an instantaneous reading can catch a busy partition at a quiet moment,
    and an average that is larger says so. The accumulated share is (gfx_busy_acc's change)
    / (accumulation_counter's change), our reading of amdsmi.h's "Utilization Accumulated
    (%)" beside the counter the library divides its throttle residencies by; an average
    outside 0-100 (the reading wrong on some driver) is ignored, so it can only raise."""
    if isinstance(busy, Absent):
        return busy
    if not 0 <= pid < len(busy.inst):
        return Absent.UNSUPPORTED
    xccs = [i for i, v in enumerate(busy.inst[pid]) if 0 <= v <= 100]
    if not xccs:
        return Absent.UNSUPPORTED
    inst = sum(busy.inst[pid][i] for i in xccs) / len(xccs)
    if last is None or busy.counter in (0, U64_NA) or last.counter == U64_NA:
        return inst
    cycles = busy.counter - last.counter
    if cycles <= 0 or len(last.acc) <= pid:
        return inst
    shares = []
    for i in xccs:
        now, then = busy.acc[pid][i], last.acc[pid][i]
        if U64_NA in (now, then) or now < then:
            return inst
        shares.append((now - then) / cycles)
    average = sum(shares) / len(shares)
    return max(inst, average) if 0 <= average <= 100 else inst
