"""One physical AMD GPU whose partitions the library enumerates as processors, read as MIG's
counterpart: one ``GpuSample`` with ``mig_enabled`` and one ``MigSample`` per partition.

Per physical GPU (read on its first partition): GFX and UMC activity (the average over all
partitions: never a partition's own), power, hotspot temperature, and the GPU metrics
table. Per partition: its GFX busy share from that table (``xcp_stats[partition]``; absent
from the table it is ``unsupported``, never the GPU's activity), its VRAM as
``telemetry.amdsmi_vram`` makes of what the library reads for its handle (its own, or
UNAVAILABLE with the reason when the handle reports a pool), its process list, and which
device-plugin device it is (its PCI address, or ``amdgpu_xcp_<n>``): read from sysfs, the
partition's render node (``amdsmi_get_gpu_enumeration_info``) and
``<sys>/class/drm/renderD<n>/device``. When that cannot be read the partition has no name,
no pod can be matched to it, and a problem says why - its pods read unknown.

Identity. Before ROCm 7.12 every partition of a GPU answers the GPU's UUID
(ROCm/rocm-systems#3977 put the partition ID into it): keyed by UUID alone they would be
one device. Partitions whose UUIDs repeat are keyed by their GPU (PCI device) and partition
ID instead, and the log says so once.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gpuscale.telemetry.amdsmi_busy import BusyTable, gfx_busy, xcp_busy
from gpuscale.telemetry.amdsmi_library import Calls, Lost
from gpuscale.telemetry.amdsmi_values import (
    Processor,
    count,
    isum,
    lost_partition,
    partition_key,
    process_bytes,
    sample,
)
from gpuscale.telemetry.amdsmi_vram import partition_vram, trusted_used
from gpuscale.telemetry.model import (
    Absent,
    GpuSample,
    IntReading,
    MigSample,
    ProcessSample,
    SharingMode,
)


def processes(calls: Calls, index: int,
              procs: Any) -> tuple[tuple[ProcessSample, ...], Absent]:
    """A processor's process list (PID and VRAM; busy shares are not read, see
    ``amdsmi_backend``), and why it is not complete. An entry without a PID makes the list
    unavailable this tick (whose process it is cannot be said)."""
    if isinstance(procs, Absent):
        return (), procs
    out = []
    for p in procs if isinstance(procs, list) else [None]:
        pid = p.get("pid") if isinstance(p, dict) else None
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
            calls.problem(f"gpu {index}: processes: unavailable (an entry without a PID)")
            return (), Absent.UNAVAILABLE
        assert isinstance(p, dict)
        usage = p.get("memory_usage")
        vram = usage.get("vram_mem") if isinstance(usage, dict) else None
        out.append(ProcessSample(pid, process_bytes(vram), sm_util_percent=Absent.UNSUPPORTED))
    return tuple(out), Absent.UNSUPPORTED


class Partitions:
    """Reads partitioned GPUs; keeps, across ticks, each partition's last device-plugin
    name (for its pods should it be lost) and each GPU's last metrics table."""

    def __init__(self, calls: Calls, drm: str) -> None:
        self._calls = calls
        self._drm = drm
        # (PCI device, enumeration index) -> its last device-plugin name: neither a UUID
        # (partitions may share one) nor a partition ID (unreadable once it is lost)
        self.names: dict[str, str] = {}
        self.busy: dict[str, BusyTable] = {}  # PCI device -> its last metrics table
        self.rocm = ""  # the node's ROCm version, for reasons ("" when not read)

    def read(self, members: list[Processor], modes: tuple[str, str],
             lost: Callable[[int], GpuSample]) -> GpuSample:
        """One physical GPU of ``members`` (its processors) in partition ``modes``;
        ``lost(index)`` is the sample of a GPU that fell off the bus."""
        calls = self._calls
        smi = calls.smi
        assert smi is not None
        parts, shared = self._ids(members)
        first = parts[0][1]
        parent = first.uuid
        profile = ".".join(x.lower() for x in modes if x) or "partition"
        try:
            activity = calls.call(first.index, "activity", smi.amdsmi_get_gpu_activity,
                                  first.handle)
            power = calls.call(first.index, "power", smi.amdsmi_get_power_info, first.handle)
            temp = calls.call(first.index, "temperature", smi.amdsmi_get_temp_metric,
                              first.handle, smi.AmdSmiTemperatureType.HOTSPOT,
                              smi.AmdSmiTemperatureMetric.CURRENT)
            busy = calls.call(first.index, "metrics", gfx_busy, first.handle, smi)
        except Lost:
            gone = lost(first.index)
            parent = gone.uuid
            migs = tuple(lost_partition(pid, self._own(m, shared), parent, profile,
                                        self.names.get(_slot(m), ""))
                         for pid, m in parts)
            return replace(gone, mig_enabled=True, sharing=SharingMode.MIG, migs=migs)
        calls.cleared(f"gpu {first.index}")
        last = self.busy.get(first.device)
        if isinstance(busy, BusyTable):
            self.busy[first.device] = busy
        migs, used, total, why = self._partitions(
            parts, shared, first, profile, modes[1],
            [xcp_busy(busy, last, pid) for pid, _ in parts])
        procs = tuple(p for mig in migs for p in mig.processes)
        unknown = next((mig.processes_unknown for mig in migs
                        if mig.processes_unknown is not Absent.UNSUPPORTED
                        and mig.processes_unknown is not None), Absent.UNSUPPORTED)
        return sample(first.index, first.uuid, first.name, f"{first.device}.0", activity,
                      used, total, power, temp, mig_enabled=True, sharing=SharingMode.MIG,
                      migs=migs, processes=procs, processes_unknown=unknown,
                      memory_reason=why)

    def table_partitions(self, device: str) -> int:
        """How many partitions the GPU's last metrics table says it has (0: not said)."""
        table = self.busy.get(device)
        return table.partitions if table else 0

    @staticmethod
    def _own(m: Processor, shared: bool) -> Processor:
        """The partition as keyed: without its UUID when partitions share one."""
        return replace(m, uuid="") if shared else m

    @staticmethod
    def _key(m: Processor, shared: bool, parent: str, pid: int) -> str:
        return partition_key("" if shared else m.uuid, parent, pid)

    def _ids(self, members: list[Processor]) -> tuple[list[tuple[int, Processor]], bool]:
        """Each member with its partition ID (the KFD's), in partition order (members
        whose IDs are unreadable or repeated get distinct negative keys: no table row), and
        whether they share a UUID (then each is keyed by its GPU and partition ID)."""
        calls = self._calls
        smi = calls.smi
        assert smi is not None
        parts: list[tuple[int, Processor]] = []
        for m in members:
            try:
                kfd = calls.call(m.index, "kfd", smi.amdsmi_get_gpu_kfd_info, m.handle)
            except Lost:
                kfd = Absent.LOST
            pid = kfd.get("current_partition_id") if isinstance(kfd, dict) else None
            parts.append((pid if isinstance(pid, int) else -1, m))
        parts.sort(key=lambda x: (x[0] < 0, x[0], x[1].index))
        ids = [pid for pid, _ in parts]
        if min(ids) < 0 or len(set(ids)) < len(ids):  # which row of the table is whose?
            calls.problem(f"gpu {parts[0][1].index}: partition IDs unreadable or repeated "
                          f"({ids}): its partitions' busy shares are unknown")
            parts = [(-1 - m.index, m) for _, m in parts]  # distinct keys, no table row
        uuids = [m.uuid for _, m in parts]
        shared = len(set(uuids)) < len(uuids)
        if shared:
            calls.note(f"uuid {parts[0][1].device}", f"GPU {parts[0][1].device}: its "
                       f"{len(parts)} partitions share UUID {uuids[0]} (amdsmi before ROCm "
                       f"7.12): each is kept apart by its PCI device and partition ID",
                       logging.INFO)
        return parts, shared

    def _partitions(self, parts: list[tuple[int, Processor]], shared: bool,
                    first: Processor, profile: str, memory_mode: str,
                    busy: list[float | Absent],
                    ) -> tuple[tuple[MigSample, ...], IntReading, IntReading, str]:
        """Every partition's sample, and the GPU's VRAM used and total with why they are
        not numbers ("" when they are)."""
        calls = self._calls
        smi = calls.smi
        assert smi is not None
        parent = first.uuid
        read: list[tuple[int, Processor, Any, Any, Any, str] | MigSample] = []
        for pid, m in parts:
            try:
                used = calls.call(m.index, "vram_used", smi.amdsmi_get_gpu_memory_usage,
                                  m.handle, smi.AmdSmiMemoryType.VRAM)
                total = calls.call(m.index, "vram_total", smi.amdsmi_get_gpu_memory_total,
                                   m.handle, smi.AmdSmiMemoryType.VRAM)
                procs = calls.call(m.index, "processes", smi.amdsmi_get_gpu_process_list,
                                   m.handle)
                name = self._name_of(m)
            except Lost:
                calls.note(f"gpu {m.index}", f"partition {m.uuid or m.index} is lost",
                           logging.ERROR)
                read.append(lost_partition(pid, self._own(m, shared), parent, profile,
                                           self.names.get(_slot(m), "")))
                continue
            calls.cleared(f"gpu {m.index}")
            read.append((pid, m, count(used), count(total), procs, name))
        reads = [(r.memory_used_bytes, r.memory_total_bytes) if isinstance(r, MigSample)
                 else (r[2], r[3]) for r in read]
        vram = partition_vram(first.name, memory_mode, reads, self.rocm)
        if vram.reason:
            calls.problem(f"gpu {first.index}: {vram.reason}")
        out: list[MigSample] = []
        for r, (given, total), share in zip(read, vram.partitions, busy, strict=True):
            if isinstance(r, MigSample):
                out.append(r)
                continue
            pid, m, _, _, procs, name = r
            listed, unknown = processes(calls, m.index, procs)
            used, why = (given, vram.reason) if vram.reason else trusted_used(
                given, partition=True, processes=len(listed), busy=share)
            if why and not vram.reason:
                calls.problem(f"gpu {m.index}: {why}")
            out.append(MigSample(
                uuid=self._key(m, shared, parent, pid), parent_uuid=parent,
                index=max(pid, 0), gpu_instance_id=pid, compute_instance_id=0,
                profile=profile, memory_used_bytes=used, memory_total_bytes=total,
                utilization_percent=share, processes=listed, processes_unknown=unknown,
                device_id=name, memory_reason=why))
        gpu_used = vram.gpu_used
        if not vram.reason:  # the sum of what the partitions' pods get
            gpu_used = isum([mig.memory_used_bytes for mig in out])
        return tuple(out), gpu_used, vram.gpu_total, vram.reason

    def _name_of(self, m: Processor) -> str:
        """The device plugin's name for a partition (from its render node in sysfs), or ""
        when it cannot be read (then a problem says why)."""
        calls = self._calls
        smi = calls.smi
        assert smi is not None
        info = calls.call(m.index, "enumeration", smi.amdsmi_get_gpu_enumeration_info,
                          m.handle)
        render = info.get("drm_render") if isinstance(info, dict) else None
        if not isinstance(render, int):
            calls.problem(f"gpu {m.index}: which device-plugin device this partition is "
                          f"cannot be read (no render node from amdsmi): its pods are "
                          f"unknown")
            return ""
        # Read every tick (one readlink): a render node is another device's after the
        # driver reloads into another partition mode. The node's `device` is a link up to
        # its device's directory ("../../../<name>").
        link = f"{self._drm}/renderD{render}/device"
        try:
            name = os.path.basename(os.readlink(link).rstrip("/"))
        except OSError as exc:
            calls.problem(f"gpu {m.index}: which device-plugin device this partition is "
                          f"cannot be read ({link}: {exc.strerror}; mount the host's "
                          f"/sys): its pods are unknown")
            return ""
        self.names[_slot(m)] = name  # kept for its pods should it be lost
        return name



def _slot(m: Processor) -> str:
    return f"{m.device}/{m.index}"
