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
processors to the library (an MI300X in CPX: 8), each with its own render node, VRAM
reading and process list; the device plugin hands each to a pod on its own. Here the
processors of one PCI device (domain:bus:device; older KFDs put the partition ID in the
function) are one physical ``GpuSample`` with ``mig_enabled`` and one ``MigSample`` per
partition - MIG's seam; ``telemetry.amdsmi_partitions`` reads them, and
``telemetry.amdsmi_vram`` says which of their VRAM readings a pod can be given.

Repartition. The library enumerates its processors at ``amdsmi_init`` and keeps that list
until it is shut down: after the GPU is switched to another partition mode, the old
handles stay (those of partitions that are gone answer errors) and the new partitions are
not listed. The enumeration is taken as stale, and the library shut down, initialised and
asked again within the same tick, when a GPU's compute or memory partition mode is not the
one it had when enumerated, or its metrics table counts another number of partitions
than the processors enumerated for it.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

from gpuscale.telemetry.amdsmi_library import (
    Calls,
    Down,
    Lost,
    load_amdsmi,
    load_failure,
    version_skew,
    why,
)
from gpuscale.telemetry.amdsmi_partitions import Partitions, processes
from gpuscale.telemetry.amdsmi_values import (
    Processor,
    count,
    lost_gpu,
    sample,
    unknown_gpu,
)
from gpuscale.telemetry.amdsmi_vram import trusted_used
from gpuscale.telemetry.model import (
    Absent,
    BackendState,
    GpuSample,
    NodeSnapshot,
)

log = logging.getLogger("gpuscale.telemetry.amdsmi")

_load_amdsmi = load_amdsmi  # the name callers and tests pass as ``load``


def present() -> bool:
    """Whether this node has an AMD GPU stack to ask (the ROCm kernel driver's /dev/kfd)."""
    return os.path.exists("/dev/kfd")


class AmdSmiBackend:
    name = "amdsmi"

    def __init__(self, hostname: str | None = None,
                 load: Callable[[], ModuleType] = load_amdsmi,
                 clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic,
                 sys_root: Path = Path("/sys")) -> None:
        self._node = hostname or socket.gethostname()
        self._load = load
        self._clock = clock
        self._monotonic = monotonic
        self._calls = Calls()
        self._parts = Partitions(self._calls, str(sys_root / "class" / "drm"))
        self._initialized = False
        self._layout: tuple[str, ...] = ()  # each processor's UUID last tick ("?": unread)
        # index -> (uuid, PCI address, name) from its last good read: a GPU lost later
        # keeps its identity, so the pods allocated it read lost, not unknown
        self._known: dict[int, tuple[str, str, str]] = {}
        # PCI device -> its (compute, memory) partition modes when it was enumerated
        self._enumerated: dict[str, tuple[str, str]] = {}
        self._stale = ""  # why this tick's enumeration is stale ("" when it is not)
        self._refreshed = ""  # the staleness a refresh did not cure (not retried)

    # -- lifecycle ---------------------------------------------------------------------

    def _init(self) -> None:
        calls = self._calls
        if calls.smi is None:
            try:
                calls.smi = self._load()
            except (ImportError, OSError, KeyError, AttributeError) as exc:
                # The package prints and leaves its library table empty when it cannot
                # find libamd_smi.so (a KeyError on import); a library that lacks a
                # function the package binds fails the import with that symbol's name.
                raise Down(load_failure(exc)) from None
        smi = calls.smi
        try:
            smi.amdsmi_init(smi.AmdSmiInitFlags.INIT_AMD_GPUS)
        except smi.AmdSmiLibraryException as exc:
            raise Down(why(exc)) from None
        self._initialized = True
        # handles and positions are new: nothing known by position carries over
        self._known.clear()
        self._parts.busy.clear()
        self._enumerated.clear()
        self._layout = ()
        skew = self._version_skew()
        if skew:
            self.close()
            raise Down(skew)

    def _version_skew(self) -> str:
        """Why this node's ROCm cannot be read with this amdsmi package, or "" (see
        ``amdsmi_library.version_skew``); a ROCm whose version cannot be read is logged
        once and used (the image ships the two together)."""
        smi = self._calls.smi
        assert smi is not None
        package = str(getattr(smi, "__version__", ""))
        try:
            ok, rocm = smi.amdsmi_get_rocm_version()
        except Exception as exc:  # the package's own lookup failed: treat as unknown
            ok, rocm = False, f"{type(exc).__name__}"
        self._parts.rocm = str(rocm) if ok else ""
        if not ok:
            self._calls.note("rocm version", f"cannot check this node's ROCm version "
                             f"against the amdsmi package {package} ({str(rocm)[:120]}): "
                             f"readings assume they match", logging.WARNING)
            return ""
        return version_skew(package, str(rocm))

    def close(self) -> None:
        smi = self._calls.smi
        if self._initialized and smi is not None:
            try:
                smi.amdsmi_shut_down()
            except smi.AmdSmiLibraryException as exc:
                log.debug("amdsmi_shut_down: %s", exc)
        self._initialized = False

    # -- one tick ----------------------------------------------------------------------

    def sample(self) -> NodeSnapshot:
        began = self._monotonic()
        taken_at = self._clock()
        calls = self._calls
        calls.problems = []
        try:
            gpus = self._read()
            if self._stale and self._stale != self._refreshed:
                calls.note("enumeration", f"GPUs enumerated again: {self._stale}",
                           logging.WARNING)
                self.close()
                calls.problems = []  # what the stale handles answered is not news
                gpus = self._read()
                self._refreshed = self._stale  # not cured: not tried again for the same
            if self._stale:
                calls.problem(f"the library's enumeration disagrees with the GPUs after "
                              f"enumerating them again: {self._stale}")
            else:
                self._refreshed = ""
        except Down as exc:
            return self._down(str(exc), taken_at, began)
        except Exception as exc:  # the library as a whole failed: start over next tick
            if calls.smi is None or not isinstance(exc, calls.smi.AmdSmiException):
                raise
            self.close()
            return self._down(why(exc), taken_at, began)
        calls.cleared("node")
        # at their place in the snapshot: partitions make the library's processor
        # numbering differ from the GPUs'
        return NodeSnapshot(node=self._node, backend=self.name, taken_at=taken_at,
                            monotonic=began,
                            gpus=tuple(replace(g, index=i) for i, g in enumerate(gpus)),
                            duration_seconds=self._monotonic() - began,
                            problems=tuple(calls.problems))

    def _read(self) -> list[GpuSample]:
        if not self._initialized:
            self._init()
        assert self._calls.smi is not None
        handles = self._calls.smi.amdsmi_get_processor_handles()
        self._stale = ""
        return self._gpus(handles)

    def _down(self, reason: str, taken_at: float, began: float) -> NodeSnapshot:
        self._calls.note("node", f"amdsmi unavailable: {reason}", logging.WARNING)
        return NodeSnapshot(node=self._node, backend=self.name, taken_at=taken_at,
                            monotonic=began, state=BackendState.UNAVAILABLE,
                            reason=reason, duration_seconds=self._monotonic() - began)

    def _gpus(self, handles: list[Any]) -> list[GpuSample]:
        """Every processor read: whole GPUs, and partitions grouped by their GPU."""
        order: list[GpuSample | str] = []  # in enumeration order: a GPU, or a group key
        groups: dict[str, list[Processor]] = {}
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
            self._check_modes(entry, modes)
            if len(members) == 1 and modes[0] in ("SPX", ""):
                out.append(self._gpu(members[0]))
                continue
            out.append(self._parts.read(members, modes, self._lost))
            table = self._parts.table_partitions(entry)
            if table and table != len(members) and not self._stale:
                self._stale = (f"GPU {entry}'s metrics table counts {table} partitions, "
                               f"{len(members)} were enumerated")
        return out

    def _check_modes(self, device: str, modes: tuple[str, str]) -> None:
        """Note the GPU's partition modes at its first reading since enumeration; a later
        reading of other modes makes the enumeration stale (it was repartitioned)."""
        if "" in modes:  # not read: no evidence either way
            return
        then = self._enumerated.setdefault(device, modes)
        if then != modes and not self._stale:
            self._stale = (f"GPU {device} was repartitioned from "
                           f"{'/'.join(then)} to {'/'.join(modes)}")

    def _relayout(self, layout: tuple[str, ...]) -> None:
        """Forget what was known by position when the processors are not the same ones in
        the same places any more (a partition mode changed, a GPU went): an index may now
        be another GPU's."""
        same = len(layout) == len(self._layout) and all(
            "?" in (a, b) or a == b for a, b in zip(layout, self._layout, strict=True))
        if not same:
            self._known = {i: k for i, k in self._known.items()
                           if i < len(layout) and layout[i] == k[0]}
            self._parts.busy.clear()
        self._layout = layout

    def _identify(self, index: int, h: Any) -> Processor | GpuSample:
        """A processor's identity, or the GpuSample that says it cannot be had (lost, or
        never readable)."""
        calls = self._calls
        smi = calls.smi
        assert smi is not None
        try:
            got_uuid = calls.call(index, "uuid", smi.amdsmi_get_gpu_device_uuid, h)
            got_bdf = calls.call(index, "bdf", smi.amdsmi_get_gpu_device_bdf, h)
            known = self._known.get(index)
            if known and known[2] and known[0] == got_uuid:  # the same GPU: its name too
                asic: Any = {"market_name": known[2]}
            else:
                asic = calls.call(index, "asic", smi.amdsmi_get_gpu_asic_info, h)
        except Lost:
            return self._lost(index)
        name = str(asic.get("market_name", "")) if isinstance(asic, dict) else ""
        if isinstance(got_uuid, Absent) or isinstance(got_bdf, Absent):
            last = self._known.get(index)
            other = last is not None and (
                (not isinstance(got_uuid, Absent) and str(got_uuid) != last[0])
                or (not isinstance(got_bdf, Absent) and str(got_bdf) != last[1]))
            if last is None or other:  # no identity (or another GPU's): nothing matches it
                return unknown_gpu(index)
            uuid, bdf, name = last
        else:
            uuid, bdf = str(got_uuid), str(got_bdf)
            self._known[index] = (uuid, bdf, name)  # lost later this tick: still this GPU
        return Processor(index, h, uuid, bdf, name)

    def _modes(self, p: Processor) -> tuple[str, str]:
        """The GPU's compute and memory partition modes ("" where it has none)."""
        calls = self._calls
        smi = calls.smi
        assert smi is not None
        try:
            compute = calls.call(p.index, "compute_partition",
                                 smi.amdsmi_get_gpu_compute_partition, p.handle)
            memory = calls.call(p.index, "memory_partition",
                                smi.amdsmi_get_gpu_memory_partition, p.handle)
        except Lost:
            return "", ""
        return (str(compute).strip().upper() if not isinstance(compute, Absent) else "",
                str(memory).strip().upper() if not isinstance(memory, Absent) else "")

    def _lost(self, index: int) -> GpuSample:
        uuid, bdf, name = self._known.get(index, ("", "", ""))
        self._calls.note(f"gpu {index}", f"GPU {uuid or index} is lost", logging.ERROR)
        return lost_gpu(index, uuid, name, bdf)

    def _gpu(self, p: Processor) -> GpuSample:
        """A whole GPU (not partitioned)."""
        calls = self._calls
        smi = calls.smi
        assert smi is not None
        index, h = p.index, p.handle
        try:
            activity = calls.call(index, "activity", smi.amdsmi_get_gpu_activity, h)
            used = calls.call(index, "vram_used", smi.amdsmi_get_gpu_memory_usage, h,
                              smi.AmdSmiMemoryType.VRAM)
            total = calls.call(index, "vram_total", smi.amdsmi_get_gpu_memory_total, h,
                               smi.AmdSmiMemoryType.VRAM)
            power = calls.call(index, "power", smi.amdsmi_get_power_info, h)
            temp = calls.call(index, "temperature", smi.amdsmi_get_temp_metric, h,
                              smi.AmdSmiTemperatureType.HOTSPOT,
                              smi.AmdSmiTemperatureMetric.CURRENT)
            procs = calls.call(index, "processes", smi.amdsmi_get_gpu_process_list, h)
        except Lost:
            return self._lost(index)
        calls.cleared(f"gpu {index}")
        listed, unknown = processes(calls, index, procs)
        vram, reason = trusted_used(count(used), partition=False, processes=len(listed),
                                    busy=Absent.UNSUPPORTED)
        if reason:
            calls.problem(f"gpu {index}: {reason}")
        return sample(index, p.uuid, p.name, p.bdf, activity, vram, count(total), power,
                      temp, processes=listed, processes_unknown=unknown,
                      memory_reason=reason)
