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
amdgpu lists only processes that used the GPU recently (its fdinfo), so the list is not
everything holding a context: it is marked incomplete (``processes_unknown``
UNSUPPORTED), and a GPU shared by several pods then reads "shared", never 0 for a pod whose
process is not listed; per-process engine use is not turned into a percentage here.

A call that succeeded before on a GPU and now answers "not supported" is ``unavailable``,
not ``unsupported`` (rocm_smi maps a vanished sysfs file to NOT_SUPPORTED: the GPU may be
going away). A GPU whose identity (UUID, PCI address) cannot be read and was never read
before is UNAVAILABLE as a whole: its pods cannot be matched to it. Anything else the
package raises for one reading (a name that is not UTF-8, say) is ``unavailable`` for
that reading, never the tick's end.

Partitions (CPX/DPX/QPX compute partitions, NPS memory partitions) are not read yet: a
partitioned GPU appears as the processors the library enumerates.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import socket
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from gpuscale.common.errors import PeerError
from gpuscale.telemetry.model import (
    Absent,
    BackendState,
    GpuSample,
    GpuState,
    NodeSnapshot,
    ProcessSample,
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


class AmdSmiBackend:
    name = "amdsmi"

    def __init__(self, hostname: str | None = None,
                 load: Callable[[], ModuleType] = _load_amdsmi,
                 clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._node = hostname or socket.gethostname()
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
        gpus = tuple(self._gpu(i, h) for i, h in enumerate(handles))
        return NodeSnapshot(node=self._node, backend=self.name, taken_at=taken_at,
                            monotonic=began, gpus=gpus,
                            duration_seconds=self._monotonic() - began,
                            problems=tuple(self._problems))

    def _down(self, reason: str, taken_at: float, began: float) -> NodeSnapshot:
        self._note("node", f"amdsmi unavailable: {reason}", logging.WARNING)
        return NodeSnapshot(node=self._node, backend=self.name, taken_at=taken_at,
                            monotonic=began, state=BackendState.UNAVAILABLE,
                            reason=reason, duration_seconds=self._monotonic() - began)

    def _gpu(self, index: int, h: Any) -> GpuSample:
        smi = self._smi
        assert smi is not None
        uuid = ""
        try:
            got_uuid = self._call(index, "uuid", smi.amdsmi_get_gpu_device_uuid, h)
            got_bdf = self._call(index, "bdf", smi.amdsmi_get_gpu_device_bdf, h)
            asic = self._call(index, "asic", smi.amdsmi_get_gpu_asic_info, h)
            name = str(asic.get("market_name", "")) if isinstance(asic, dict) else ""
            if isinstance(got_uuid, Absent) or isinstance(got_bdf, Absent):
                if index not in self._known:  # no identity: its pods cannot be matched
                    return _unknown_gpu(index)
                uuid, bdf, name = self._known[index]
            else:
                uuid, bdf = str(got_uuid), str(got_bdf)
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
            uuid, bdf, name = self._known.get(index, (uuid, "", ""))
            self._note(f"gpu {index}", f"GPU {uuid or index} is lost", logging.ERROR)
            return GpuSample(index=index, uuid=uuid, name=name, pci_bus_id=bdf, minor_number=-1,
                             state=GpuState.LOST, utilization_percent=Absent.LOST,
                             memory_util_percent=Absent.LOST, memory_used_bytes=Absent.LOST,
                             memory_total_bytes=Absent.LOST, power_watts=Absent.LOST,
                             temperature_c=Absent.LOST, processes_unknown=Absent.LOST)
        self._cleared(f"gpu {index}")
        if uuid and bdf:
            self._known[index] = (uuid, bdf, name)
        processes: tuple[ProcessSample, ...] = ()
        # amdgpu lists only processes that ran lately: never the full list (see above)
        unknown: Absent = procs if isinstance(procs, Absent) else Absent.UNSUPPORTED
        if not isinstance(procs, Absent):
            processes = tuple(
                ProcessSample(int(p["pid"]), _bytes(p.get("memory_usage", {}).get("vram_mem")),
                              sm_util_percent=Absent.UNSUPPORTED)
                for p in procs)
        used_b, total_b = _count(used), _count(total)
        return GpuSample(
            index=index, uuid=uuid, name=name, pci_bus_id=bdf, minor_number=-1,
            utilization_percent=_percent(_field(activity, "gfx_activity")),
            memory_util_percent=_percent(_field(activity, "umc_activity")),
            memory_used_bytes=used_b, memory_total_bytes=total_b,
            memory_free_bytes=(total_b - used_b if not isinstance(total_b, Absent)
                               and not isinstance(used_b, Absent) else Absent.UNAVAILABLE),
            power_watts=_field(power, "current_socket_power"),
            power_limit_watts=_field(power, "power_limit"),
            temperature_c=temp if isinstance(temp, Absent) else float(temp),
            processes=processes, processes_unknown=unknown)

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
