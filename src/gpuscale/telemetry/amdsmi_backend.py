"""AMD backend on the ``amdsmi`` package (ctypes over ROCm's ``libamd_smi.so``): the AMD
Instinct GPUs of this node, behind the same seam as NVML (``telemetry.backend``).

Lifecycle as NVML's: the first ``sample`` imports the package (it loads the library from
``$ROCM_PATH/lib``, ``/opt/rocm/lib`` or the linker's path) and initialises it for AMD GPUs;
if that fails the snapshot is UNAVAILABLE with a reason a person can act on (library not
found, amdgpu driver not loaded, not permitted), and every later tick tries again. A GPU
whose calls answer "not found" fell off the bus (its sysfs node is gone): LOST, every
reading ``Absent.LOST``, its process list unknown, while the others carry on. A call a GPU
does not support is ``Absent.UNSUPPORTED`` for that reading (and so is a field the
library marks N/A, 0xFFFF, inside a successful call); any other failure is
``Absent.UNAVAILABLE`` for that reading this tick, said once in ``problems``.

Readings (units of ``telemetry.model``): utilization = GFX activity (0-100, the busy share
of the graphics/compute engine), memory utilization = UMC activity, memory from the VRAM
usage (MiB from the library, bytes here), power = current socket power, temperature = the
hotspot (junction) sensor - MI300 has no edge sensor. VRAM is read in bytes (the
memory-usage calls; the VRAM-usage call rounds down to whole MiB). Processes: pid and VRAM;
The process list comes from the KFD (every process with a compute context on the GPU),
but a process can be missing from it: the library answers success with an emptied list
after an error, and another user's processes need permissions the agent may not have. So
it is marked incomplete (``processes_unknown`` UNSUPPORTED), and a GPU shared by several
pods reads "shared" for each - never 0 for a pod whose process is missing. Per-process
busy shares are not read: the library's per-process GFX time is the DRM scheduler's
(fdinfo ``drm-engine-gfx``), which work on the KFD's compute queues - ROCm programs,
vLLM among them - never passes (ROCm/amdsmi#130: a GPU 97 % busy, its process 0 ns).

A call that succeeded before on a GPU and now answers "not supported" is ``unavailable``,
not ``unsupported`` (rocm_smi maps a vanished sysfs file to NOT_SUPPORTED: the GPU may be
going away). A GPU whose identity (UUID, PCI address) cannot be read and was never read
before is UNAVAILABLE as a whole: its pods cannot be matched to it. Anything else the
package raises for one reading (a name that is not UTF-8, say) is ``unavailable`` for
that reading, never the tick's end.

Partitions. A GPU in a compute-partition mode other than SPX (DPX, QPX, CPX) is several
processors to the library (an MI300X in CPX: 8), each with its own UUID, render node,
VRAM reading and process list; the device plugin hands each to a pod on its own. Here the
processors of one PCI device (domain:bus:device; older KFDs put the partition ID in the
function) are one physical ``GpuSample`` with ``mig_enabled`` and one ``MigSample`` per
partition - MIG's seam. Per physical GPU (read on its first partition): GFX and UMC
activity (the average over all partitions: never a partition's own), power, hotspot
temperature, and the GPU metrics table. Per partition: its GFX busy share from that
table (``xcp_stats[partition].gfx_busy_inst``, the mean over the XCCs it holds; absent
from the table, it is ``unsupported``, never the GPU's activity), its VRAM as the library
reads it for its handle, its process list. Which device-plugin device a partition is
(its PCI address, or ``amdgpu_xcp_<n>``) is read from sysfs: the partition's render node
(``amdsmi_get_gpu_enumeration_info``) and ``<sys>/class/drm/renderD<n>/device``. When that
cannot be read the partition has no name, no pod can be matched to it, and a problem says
why - its pods read unknown, never the GPU's numbers.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any

from gpuscale.common.errors import PeerError
from gpuscale.telemetry.model import (
    Absent,
    BackendState,
    GpuSample,
    GpuState,
    MigSample,
    NodeSnapshot,
    ProcessSample,
    SharingMode,
)

log = logging.getLogger("gpuscale.telemetry.amdsmi")

MIB = 1024 * 1024
NA = 0xFFFF  # what the library writes into a field it cannot fill
# amdsmi_status_t values (amdsmi.h)
NOT_SUPPORTED, NO_PERM, NOT_FOUND, DRIVER_NOT_LOADED, RESTART_ERR = 2, 10, 31, 34, 54
_WHY = {NO_PERM: "not permitted (the agent needs read access to /dev/kfd and /dev/dri)",
        DRIVER_NOT_LOADED: "the amdgpu driver is not loaded",
        NOT_FOUND: "the GPU is gone (its device node disappeared)",
        RESTART_ERR: "the amdgpu driver is restarting"}


class _Lost(PeerError):
    """A GPU answered that it is gone: the rest of its tick is LOST."""


def _load_amdsmi() -> ModuleType:
    # The package prints to stdout when it cannot find the library (and then fails on a
    # missing table entry): keep that off our output, the exception says it.
    with contextlib.redirect_stdout(io.StringIO()):
        import amdsmi  # type: ignore[import-untyped]

    module: ModuleType = amdsmi
    return module


def present() -> bool:
    """Whether this node has an AMD GPU stack to ask (the ROCm kernel driver's /dev/kfd)."""
    return os.path.exists("/dev/kfd")


@dataclass(frozen=True, slots=True)
class _Processor:
    """What the library enumerated: one GPU, or one partition of a partitioned GPU."""

    index: int  # position in the library's enumeration
    handle: Any
    uuid: str
    bdf: str
    name: str

    @property
    def device(self) -> str:
        """The physical PCI device (domain:bus:device): what partitions of a GPU share."""
        return self.bdf.rsplit(".", 1)[0].lower()


class AmdSmiBackend:
    name = "amdsmi"

    def __init__(self, hostname: str | None = None,
                 load: Callable[[], ModuleType] = _load_amdsmi,
                 clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic,
                 sys_root: Path = Path("/sys")) -> None:
        self._node = hostname or socket.gethostname()
        self._drm = str(sys_root / "class" / "drm")
        self._part_names: dict[str, str] = {}  # partition UUID -> its last plugin name
        self._layout: tuple[str, ...] = ()  # each processor's UUID last tick ("?": unread)
        self._busy: dict[str, _BusyTable] = {}  # PCI device -> its last metrics table
        self._load = load
        self._clock = clock
        self._monotonic = monotonic
        self._smi: ModuleType | None = None
        self._initialized = False
        self._said: dict[str, str] = {}  # what was logged per subject (once each)
        # index -> (uuid, PCI address, name) from its last good read: a GPU lost later
        # keeps its identity, so the pods allocated it read lost, not unknown
        self._known: dict[int, tuple[str, str, str]] = {}
        self._worked: set[tuple[int, str]] = set()  # (gpu, call) that succeeded once
        self._problems: list[str] = []

    # -- lifecycle ---------------------------------------------------------------------

    def _init(self) -> None:
        if self._smi is None:
            try:
                self._smi = self._load()
            except (ImportError, OSError, KeyError, AttributeError) as exc:
                # The package prints and leaves its library table empty when it cannot
                # find libamd_smi.so (a KeyError on import): ROCm is not installed here.
                raise _Down(f"libamd_smi.so not found (ROCm not installed, or set "
                            f"ROCM_PATH): {type(exc).__name__}") from None
        smi = self._smi
        try:
            smi.amdsmi_init(smi.AmdSmiInitFlags.INIT_AMD_GPUS)
        except smi.AmdSmiLibraryException as exc:
            raise _Down(self._why(exc)) from None
        self._initialized = True
        self._known.clear()  # handles and positions are new: nothing known carries over
        self._busy.clear()
        self._layout = ()
        skew = self._version_skew()
        if skew:
            self.close()
            raise _Down(skew)

    def _version_skew(self) -> str:
        """Why this node's ROCm cannot be read with this amdsmi package, or "". The package
        declares the library's structures in Python (amdsmi_wrapper.py, generated from one
        ROCm's amdsmi.h) and is versioned as that ROCm: another ROCm release may lay them
        out differently, and a reading through the wrong layout is a wrong number. Major
        and minor must match; a ROCm whose version cannot be read is logged once and
        used (the image ships the two together)."""
        smi = self._smi
        assert smi is not None
        package = str(getattr(smi, "__version__", ""))
        try:
            ok, rocm = smi.amdsmi_get_rocm_version()
        except Exception as exc:  # the package's own lookup failed: treat as unknown
            ok, rocm = False, f"{type(exc).__name__}"
        if not ok:
            self._note("rocm version", f"cannot check this node's ROCm version against the "
                       f"amdsmi package {package} ({str(rocm)[:120]}): readings assume "
                       f"they match", logging.WARNING)
            return ""
        if str(rocm).split(".")[:2] != package.split(".")[:2]:
            return (f"ROCm {rocm} on this node, but the amdsmi package is {package}: its "
                    f"structure layouts may not be this library's, so nothing is read. Use "
                    f"the agent image built for ROCm {'.'.join(str(rocm).split('.')[:2])}, "
                    f"or install amdsmi=={'.'.join(str(rocm).split('.')[:2])}.*")
        return ""

    def close(self) -> None:
        if self._initialized and self._smi is not None:
            try:
                self._smi.amdsmi_shut_down()
            except self._smi.AmdSmiLibraryException as exc:
                log.debug("amdsmi_shut_down: %s", exc)
        self._initialized = False

    # -- one tick ----------------------------------------------------------------------

    def sample(self) -> NodeSnapshot:
        began = self._monotonic()
        taken_at = self._clock()
        self._problems = []
        try:
            if not self._initialized:
                self._init()
            assert self._smi is not None
            handles = self._smi.amdsmi_get_processor_handles()
        except _Down as exc:
            return self._down(str(exc), taken_at, began)
        except Exception as exc:  # the library as a whole failed: start over next tick
            if self._smi is None or not isinstance(exc, self._smi.AmdSmiException):
                raise
            self.close()
            return self._down(self._why(exc), taken_at, began)
        self._cleared("node")
        # at their place in the snapshot: partitions make the library's processor
        # numbering differ from the GPUs'
        gpus = tuple(replace(g, index=i) for i, g in enumerate(self._gpus(handles)))
        return NodeSnapshot(node=self._node, backend=self.name, taken_at=taken_at,
                            monotonic=began, gpus=gpus,
                            duration_seconds=self._monotonic() - began,
                            problems=tuple(self._problems))

    def _down(self, reason: str, taken_at: float, began: float) -> NodeSnapshot:
        self._note("node", f"amdsmi unavailable: {reason}", logging.WARNING)
        return NodeSnapshot(node=self._node, backend=self.name, taken_at=taken_at,
                            monotonic=began, state=BackendState.UNAVAILABLE,
                            reason=reason, duration_seconds=self._monotonic() - began)

    def _gpus(self, handles: list[Any]) -> list[GpuSample]:
        """Every processor read: whole GPUs, and partitions grouped by their GPU."""
        order: list[GpuSample | str] = []  # in enumeration order: a GPU, or a group key
        groups: dict[str, list[_Processor]] = {}
        layout = []
        for index, h in enumerate(handles):
            got = self._identify(index, h)
            layout.append(got.uuid or "?")
            if isinstance(got, GpuSample):
                order.append(got)
                continue
            if got.device not in groups:
                order.append(got.device)
            groups.setdefault(got.device, []).append(got)
        self._relayout(tuple(layout))
        out: list[GpuSample] = []
        for entry in order:
            if isinstance(entry, GpuSample):
                out.append(entry)
                continue
            members = groups[entry]
            modes = self._modes(members[0])
            if len(members) == 1 and modes[0] in ("SPX", ""):
                out.append(self._gpu(members[0]))
            else:
                out.append(self._partitioned(members, modes))
        return out

    def _relayout(self, layout: tuple[str, ...]) -> None:
        """Forget what was known by position when the processors are not the same ones in
        the same places any more (a partition mode changed, a GPU went): an index may now
        be another GPU's."""
        same = len(layout) == len(self._layout) and all(
            "?" in (a, b) or a == b for a, b in zip(layout, self._layout, strict=True))
        if not same:
            self._known = {i: k for i, k in self._known.items()
                           if i < len(layout) and layout[i] == k[0]}
            self._busy.clear()
        self._layout = layout

    def _identify(self, index: int, h: Any) -> _Processor | GpuSample:
        """A processor's identity, or the GpuSample that says it cannot be had (lost, or
        never readable)."""
        smi = self._smi
        assert smi is not None
        try:
            got_uuid = self._call(index, "uuid", smi.amdsmi_get_gpu_device_uuid, h)
            got_bdf = self._call(index, "bdf", smi.amdsmi_get_gpu_device_bdf, h)
            known = self._known.get(index)
            if known and known[2] and known[0] == got_uuid:  # the same GPU: its name too
                asic: Any = {"market_name": known[2]}
            else:
                asic = self._call(index, "asic", smi.amdsmi_get_gpu_asic_info, h)
        except _Lost:
            return self._lost(index)
        name = str(asic.get("market_name", "")) if isinstance(asic, dict) else ""
        if isinstance(got_uuid, Absent) or isinstance(got_bdf, Absent):
            last = self._known.get(index)
            other = last is not None and (
                (not isinstance(got_uuid, Absent) and str(got_uuid) != last[0])
                or (not isinstance(got_bdf, Absent) and str(got_bdf) != last[1]))
            if last is None or other:  # no identity (or another GPU's): nothing matches it
                return _unknown_gpu(index)
            uuid, bdf, name = last
        else:
            uuid, bdf = str(got_uuid), str(got_bdf)
            self._known[index] = (uuid, bdf, name)  # lost later this tick: still this GPU
        return _Processor(index, h, uuid, bdf, name)

    def _modes(self, p: _Processor) -> tuple[str, str]:
        """The GPU's compute and memory partition modes ("" where it has none)."""
        smi = self._smi
        assert smi is not None
        try:
            compute = self._call(p.index, "compute_partition",
                                 smi.amdsmi_get_gpu_compute_partition, p.handle)
            memory = self._call(p.index, "memory_partition",
                                smi.amdsmi_get_gpu_memory_partition, p.handle)
        except _Lost:
            return "", ""
        return (str(compute).strip().upper() if not isinstance(compute, Absent) else "",
                str(memory).strip().upper() if not isinstance(memory, Absent) else "")

    def _lost(self, index: int) -> GpuSample:
        uuid, bdf, name = self._known.get(index, ("", "", ""))
        self._note(f"gpu {index}", f"GPU {uuid or index} is lost", logging.ERROR)
        return _lost_gpu(index, uuid, name, bdf)

    def _gpu(self, p: _Processor) -> GpuSample:
        smi = self._smi
        assert smi is not None
        index, h, uuid, bdf, name = p.index, p.handle, p.uuid, p.bdf, p.name
        try:
            activity = self._call(index, "activity", smi.amdsmi_get_gpu_activity, h)
            used = self._call(index, "vram_used", smi.amdsmi_get_gpu_memory_usage, h,
                              smi.AmdSmiMemoryType.VRAM)
            total = self._call(index, "vram_total", smi.amdsmi_get_gpu_memory_total, h,
                               smi.AmdSmiMemoryType.VRAM)
            power = self._call(index, "power", smi.amdsmi_get_power_info, h)
            temp = self._call(index, "temperature", smi.amdsmi_get_temp_metric, h,
                              smi.AmdSmiTemperatureType.HOTSPOT,
                              smi.AmdSmiTemperatureMetric.CURRENT)
            procs = self._call(index, "processes", smi.amdsmi_get_gpu_process_list, h)
        except _Lost:
            return self._lost(index)
        self._cleared(f"gpu {index}")
        processes, unknown = self._processes(index, procs)
        return _sample(index, uuid, name, bdf, activity, _count(used), _count(total), power,
                       temp, processes=processes, processes_unknown=unknown)

    def _partitioned(self, members: list[_Processor], modes: tuple[str, str]) -> GpuSample:
        """One physical GPU whose partitions the library enumerates as processors."""
        smi = self._smi
        assert smi is not None
        parts: list[tuple[int, _Processor]] = []
        for m in members:
            try:
                kfd = self._call(m.index, "kfd", smi.amdsmi_get_gpu_kfd_info, m.handle)
            except _Lost:
                kfd = Absent.LOST
            pid = kfd.get("current_partition_id") if isinstance(kfd, dict) else None
            parts.append((pid if isinstance(pid, int) else -1, m))
        parts.sort(key=lambda x: (x[0] < 0, x[0], x[1].index))
        ids = [pid for pid, _ in parts]
        if min(ids) < 0 or len(set(ids)) < len(ids):  # which row of the table is whose?
            self._problem(f"gpu {parts[0][1].index}: partition IDs unreadable or repeated "
                          f"({ids}): its partitions' busy shares are unknown")
            parts = [(-1 - m.index, m) for _, m in parts]  # distinct keys, no table row
        first = parts[0][1]
        profile = ".".join(x.lower() for x in modes if x) or "partition"
        try:
            activity = self._call(first.index, "activity", smi.amdsmi_get_gpu_activity,
                                  first.handle)
            power = self._call(first.index, "power", smi.amdsmi_get_power_info, first.handle)
            temp = self._call(first.index, "temperature", smi.amdsmi_get_temp_metric,
                              first.handle, smi.AmdSmiTemperatureType.HOTSPOT,
                              smi.AmdSmiTemperatureMetric.CURRENT)
            busy = self._call(first.index, "metrics", _gfx_busy, first.handle, smi)
        except _Lost:
            lost = self._lost(first.index)
            migs = tuple(_lost_partition(pid, m, lost.uuid, profile,
                                         self._part_names.get(m.uuid, ""))
                         for pid, m in parts)
            return replace(lost, mig_enabled=True, sharing=SharingMode.MIG, migs=migs)
        self._cleared(f"gpu {first.index}")
        last = self._busy.get(first.device)
        if isinstance(busy, _BusyTable):
            self._busy[first.device] = busy
        migs = tuple(self._partition(pid, m, first.uuid, profile, _xcp_busy(busy, last, pid))
                     for pid, m in parts)
        procs = tuple(p for mig in migs for p in mig.processes)
        unknown = next((mig.processes_unknown for mig in migs
                        if mig.processes_unknown is not Absent.UNSUPPORTED
                        and mig.processes_unknown is not None), Absent.UNSUPPORTED)
        # The GPU's memory: the sums over its partitions (a partition's share of the GPU is
        # then right whether the driver gives each partition its share or the whole pool).
        used = _isum([mig.memory_used_bytes for mig in migs])
        total = _isum([mig.memory_total_bytes for mig in migs])
        return _sample(first.index, first.uuid, first.name, f"{first.device}.0", activity,
                       used, total, power, temp, mig_enabled=True, sharing=SharingMode.MIG,
                       migs=migs, processes=procs, processes_unknown=unknown)

    def _partition(self, pid: int, m: _Processor, parent: str, profile: str,
                   busy: float | Absent) -> MigSample:
        smi = self._smi
        assert smi is not None
        try:
            used = self._call(m.index, "vram_used", smi.amdsmi_get_gpu_memory_usage,
                              m.handle, smi.AmdSmiMemoryType.VRAM)
            total = self._call(m.index, "vram_total", smi.amdsmi_get_gpu_memory_total,
                               m.handle, smi.AmdSmiMemoryType.VRAM)
            procs = self._call(m.index, "processes", smi.amdsmi_get_gpu_process_list,
                               m.handle)
            name = self._name_of(m)
        except _Lost:
            self._note(f"gpu {m.index}", f"partition {m.uuid or m.index} is lost",
                       logging.ERROR)
            return _lost_partition(pid, m, parent, profile, self._part_names.get(m.uuid, ""))
        self._cleared(f"gpu {m.index}")
        processes, unknown = self._processes(m.index, procs)
        return MigSample(
            uuid=_partition_key(m.uuid, parent, pid), parent_uuid=parent, index=max(pid, 0),
            gpu_instance_id=pid, compute_instance_id=0, profile=profile,
            memory_used_bytes=_count(used), memory_total_bytes=_count(total),
            utilization_percent=busy, processes=processes,
            processes_unknown=unknown, device_id=name)

    def _name_of(self, m: _Processor) -> str:
        """The device plugin's name for a partition (from its render node in sysfs), or ""
        when it cannot be read (then a problem says why)."""
        smi = self._smi
        assert smi is not None
        info = self._call(m.index, "enumeration", smi.amdsmi_get_gpu_enumeration_info,
                          m.handle)
        render = info.get("drm_render") if isinstance(info, dict) else None
        if not isinstance(render, int):
            self._problem(f"gpu {m.index}: which device-plugin device this partition is "
                          f"cannot be read (no render node from amdsmi): its pods are "
                          f"unknown")
            return ""
        # Read every tick (one readlink): a render node is another device's after the
        # driver reloads into another partition mode.
        # The node's `device` is a link up to its device's directory ("../../../<name>"):
        # one readlink (the kernel resolves class/drm/renderD<n> on the way).
        link = f"{self._drm}/renderD{render}/device"
        try:
            name = os.path.basename(os.readlink(link).rstrip("/"))
        except OSError as exc:
            self._problem(f"gpu {m.index}: which device-plugin device this partition is "
                          f"cannot be read ({link}: {exc.strerror}; mount the host's "
                          f"/sys): its pods are unknown")
            return ""
        if m.uuid:
            self._part_names[m.uuid] = name  # kept for its pods should it be lost
        return name

    def _processes(self, index: int, procs: Any) -> tuple[tuple[ProcessSample, ...], Absent]:
        """A processor's process list (PID and VRAM; busy shares are not read, see the
        module's text), and why it is not complete. An entry without a PID makes the list
        unavailable this tick (whose process it is cannot be said)."""
        if isinstance(procs, Absent):
            return (), procs
        out = []
        for p in procs if isinstance(procs, list) else [None]:
            pid = p.get("pid") if isinstance(p, dict) else None
            if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
                self._problem(f"gpu {index}: processes: unavailable (an entry without a PID)")
                return (), Absent.UNAVAILABLE
            assert isinstance(p, dict)
            usage = p.get("memory_usage")
            vram = usage.get("vram_mem") if isinstance(usage, dict) else None
            out.append(ProcessSample(pid, _bytes(vram), sm_util_percent=Absent.UNSUPPORTED))
        return tuple(out), Absent.UNSUPPORTED

    def _call(self, index: int, what: str, fn: Callable[..., Any], handle: Any,
              *args: Any) -> Any:
        """One library call for one GPU: its result, or the Absent its failure means.
        Raises _Lost when the GPU is gone."""
        smi = self._smi
        assert smi is not None
        try:
            got = fn(handle, *args)
        except smi.AmdSmiLibraryException as exc:
            code = exc.get_error_code()
            if code in (NOT_FOUND, RESTART_ERR):
                raise _Lost from None
            if code == NOT_SUPPORTED and (index, what) not in self._worked:
                return Absent.UNSUPPORTED
            self._problem(f"gpu {index}: {what}: unavailable ({self._why(exc)})")
            return Absent.UNAVAILABLE
        except Exception as exc:  # retry, timeout, undecodable text: this reading only
            self._problem(f"gpu {index}: {what}: unavailable ({type(exc).__name__})")
            return Absent.UNAVAILABLE
        self._worked.add((index, what))
        return got

    # -- reasons -----------------------------------------------------------------------

    def _why(self, exc: Exception) -> str:
        code = exc.get_error_code() if hasattr(exc, "get_error_code") else None
        if code in _WHY:
            return str(_WHY[code])
        return f"{type(exc).__name__}: {str(exc).strip()[:200]}"

    def _problem(self, line: str) -> None:
        self._problems.append(line)

    def _note(self, subject: str, message: str, level: int) -> None:
        if self._said.get(subject) != message:
            self._said[subject] = message
            log.log(level, "%s", message)

    def _cleared(self, subject: str) -> None:
        if self._said.pop(subject, None) is not None:
            log.info("%s: readable again", subject)


class _Down(PeerError):
    """The library cannot be used at all this tick (the reason is the message)."""


def _field(got: Any, key: str, scale: float = 1.0) -> float | Absent:
    """A numeric field of a call's dict: the call's Absent, the library's N/A, or the
    number times ``scale``."""
    if isinstance(got, Absent):
        return got
    if not isinstance(got, dict):
        return Absent.UNAVAILABLE
    value = got.get(key)
    if value in ("N/A", None) or value == NA:
        return Absent.UNSUPPORTED
    if not isinstance(value, int | float):
        return Absent.UNAVAILABLE
    return float(value) * scale


def _count(value: Any) -> int | Absent:
    """A byte count from the library: the Absent of a failed call, or the integer."""
    if isinstance(value, Absent):
        return value
    return int(value) if isinstance(value, int) and value >= 0 else Absent.UNAVAILABLE


def _percent(value: float | Absent) -> float | Absent:
    """An activity: above 100 it is not one (a reading the library garbled)."""
    return Absent.UNAVAILABLE if not isinstance(value, Absent) and value > 100 else value


def _sample(index: int, uuid: str, name: str, bdf: str, activity: Any, used: int | Absent,
            total: int | Absent, power: Any, temp: Any, **rest: Any) -> GpuSample:
    """A GPU's sample from its calls' results (each a value or the Absent its call gave)."""
    return GpuSample(
        index=index, uuid=uuid, name=name, pci_bus_id=bdf, minor_number=-1,
        utilization_percent=_percent(_field(activity, "gfx_activity")),
        memory_util_percent=_percent(_field(activity, "umc_activity")),
        memory_used_bytes=used, memory_total_bytes=total,
        memory_free_bytes=(total - used if not isinstance(total, Absent)
                           and not isinstance(used, Absent) else Absent.UNAVAILABLE),
        power_watts=_field(power, "current_socket_power"),
        power_limit_watts=_field(power, "power_limit"),
        temperature_c=temp if isinstance(temp, Absent) else float(temp), **rest)


def _lost_gpu(index: int, uuid: str, name: str, bdf: str) -> GpuSample:
    return GpuSample(index=index, uuid=uuid, name=name, pci_bus_id=bdf, minor_number=-1,
                     state=GpuState.LOST, utilization_percent=Absent.LOST,
                     memory_util_percent=Absent.LOST, memory_used_bytes=Absent.LOST,
                     memory_total_bytes=Absent.LOST, power_watts=Absent.LOST,
                     temperature_c=Absent.LOST, processes_unknown=Absent.LOST)


def _lost_partition(pid: int, m: _Processor, parent: str, profile: str,
                    name: str) -> MigSample:
    """A partition whose GPU fell off the bus: it keeps its name, so its pods read lost."""
    return MigSample(uuid=_partition_key(m.uuid, parent, pid), parent_uuid=parent,
                     index=max(pid, 0), gpu_instance_id=pid, compute_instance_id=0,
                     profile=profile, memory_used_bytes=Absent.LOST,
                     memory_total_bytes=Absent.LOST, utilization_percent=Absent.LOST,
                     processes_unknown=Absent.LOST, device_id=name)


def _partition_key(uuid: str, parent: str, pid: int) -> str:
    """A partition's key: its own UUID, unless the library gives it the GPU's."""
    return uuid if uuid and uuid != parent else f"{parent}:p{pid}"


def _xcp_busy(busy: _BusyTable | Absent, last: _BusyTable | None, pid: int) -> float | Absent:
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


U64_NA = 2**64 - 1  # an accumulator the table does not fill


@dataclass(frozen=True, slots=True)
class _BusyTable:
    """The GPU metrics table's busy figures, per partition and XCC: the instantaneous
    shares, and the accumulated ones with the table's accumulation counter."""

    inst: list[list[int]]
    acc: list[list[int]]
    counter: int


def _gfx_busy(handle: Any, smi: ModuleType) -> _BusyTable:
    """The busy figures of the GPU metrics table: the package's own C binding and
    structure (amdsmi_wrapper), read directly - its Python interface turns all 77 fields
    into a dict each call, 2 ms of CPU a node of 8 GPUs for the few fields used. A failed
    call raises as the interface would."""
    wrapper = smi.amdsmi_interface.amdsmi_wrapper
    table = wrapper.amdsmi_gpu_metrics_t()
    status = wrapper.amdsmi_get_gpu_metrics_info(handle, ctypes.byref(table))
    if status != 0:
        raise smi.AmdSmiLibraryException(status)
    return _BusyTable([list(x.gfx_busy_inst) for x in table.xcp_stats],
                      [list(x.gfx_busy_acc) for x in table.xcp_stats],
                      int(table.accumulation_counter))


def _isum(values: list[int | Absent]) -> int | Absent:
    """A sum of byte counts, or the first reason one is missing."""
    missing = next((v for v in values if isinstance(v, Absent)), None)
    return missing if missing is not None else sum(v for v in values
                                                   if not isinstance(v, Absent))


def _unknown_gpu(index: int) -> GpuSample:
    """A GPU whose identity could not be read: nothing of it can be matched or used."""
    return GpuSample(index=index, uuid="", name="", pci_bus_id="", minor_number=-1,
                     state=GpuState.UNAVAILABLE, utilization_percent=Absent.UNAVAILABLE,
                     memory_util_percent=Absent.UNAVAILABLE,
                     memory_used_bytes=Absent.UNAVAILABLE,
                     memory_total_bytes=Absent.UNAVAILABLE, power_watts=Absent.UNAVAILABLE,
                     temperature_c=Absent.UNAVAILABLE, processes_unknown=Absent.UNAVAILABLE)


def _bytes(value: Any) -> int | Absent:
    return int(value) if isinstance(value, int) and value >= 0 else Absent.UNSUPPORTED
