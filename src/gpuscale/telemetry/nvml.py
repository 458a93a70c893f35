"""NVML backend on nvidia-ml-py: the real GPUs of this node.

Lifecycle: the first ``sample`` initialises NVML; if that fails (library missing, driver not
loaded, version mismatch, no permission) the snapshot says UNAVAILABLE with the reason, and
every later tick tries again, so the backend recovers on its own when the driver comes
back. A GPU that falls off the bus is reported LOST (its readings ``Absent.LOST``) while the
others carry on; it is read again every tick. A GPU lost in the middle of a tick keeps
nothing from that tick: its readings, its MIG instances (as last enumerated) and its process
list are all LOST, so no pod on it reads as idle. A change in the GPU count, or an error
meaning the library as a whole is gone, shuts NVML down and re-initialises on the next tick.

XID errors: every GPU is registered for critical XID events; each tick drains the event set
without waiting.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from gpuscale.telemetry.model import (
    Absent,
    BackendState,
    GpuSample,
    GpuState,
    MigSample,
    NodeSnapshot,
    SharingMode,
)
from gpuscale.telemetry.nvml_calls import (
    TIMEOUT,
    BackendDown,
    GpuLost,
    NvmlCalls,
    error_code,
    error_name,
)
from gpuscale.telemetry.nvml_device import pointer_value, read_device
from gpuscale.telemetry.nvml_mig import MIG_REFRESH_S, release
from gpuscale.telemetry.nvml_state import DeviceState, text

log = logging.getLogger("gpuscale.telemetry.nvml")

XID_CRITICAL = 0x8  # nvmlEventTypeXidCriticalError
MAX_EVENTS_PER_TICK = 1000


def _load_pynvml() -> ModuleType:
    import pynvml

    module: ModuleType = pynvml
    return module


class NvmlBackend:
    """Readings of this node's GPUs through NVML. See the module doc for the fault model."""

    name = "nvml"

    def __init__(self, pcie: bool = False, interval: float = 1.0, node: str = "",
                 nvml: ModuleType | None = None,
                 clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic,
                 sharing: Callable[[str], SharingMode] | None = None,
                 mig_refresh_s: float = MIG_REFRESH_S) -> None:
        self._nvml = nvml if nvml is not None else _load_pynvml()
        self._calls = NvmlCalls(self._nvml)
        self._pcie = pcie
        self._mig_refresh_s = mig_refresh_s
        self._interval = interval
        self._node = node or socket.gethostname()
        self._clock = clock
        self._monotonic = monotonic
        self._sharing = sharing or (lambda _uuid: SharingMode.EXCLUSIVE)
        self._initialized = False
        self._driver = ""
        self._devices: list[DeviceState | None] = []  # None: handle could not be had
        self._events: Any = None

    # -- lifecycle ----------------------------------------------------------------------

    def _init(self) -> None:
        nv = self._nvml
        nv.nvmlInit()
        self._initialized = True
        self._calls.reset()
        driver = self._calls.get("node", "", "driver_version", nv.nvmlSystemGetDriverVersion)
        self._driver = "" if isinstance(driver, Absent) else text(driver)
        count = int(nv.nvmlDeviceGetCount())
        self._devices = [self._open(i) for i in range(count)]
        self._register_events()
        log.info("NVML initialised: driver %s, %d GPUs", self._driver or "?", count)

    def _open(self, index: int) -> DeviceState | None:
        nv, c, where = self._nvml, self._calls, f"gpu {index}"
        try:
            h = nv.nvmlDeviceGetHandleByIndex(index)
            uuid = text(nv.nvmlDeviceGetUUID(h))
        except nv.NVMLError as exc:
            c.note(where, "handle", f"cannot open ({error_name(nv, error_code(exc))})")
            return None
        name = c.get(where, uuid, "name", nv.nvmlDeviceGetName, h)
        pci = c.get(where, uuid, "pci", nv.nvmlDeviceGetPciInfo, h)
        minor = c.get(where, uuid, "minor_number", nv.nvmlDeviceGetMinorNumber, h)
        mig = c.get(where, uuid, "mig_mode", nv.nvmlDeviceGetMigMode, h)
        mig_on = not isinstance(mig, Absent) and mig[0] == nv.NVML_DEVICE_MIG_ENABLE
        return DeviceState(
            index=index, handle=h, uuid=uuid,
            name="" if isinstance(name, Absent) else text(name),
            pci_bus_id="" if isinstance(pci, Absent) else text(pci.busId),
            minor_number=index if isinstance(minor, Absent) else int(minor),
            mig_enabled=mig_on,
            sharing=SharingMode.MIG if mig_on else self._sharing(uuid))

    def _register_events(self) -> None:
        nv = self._nvml
        self._events = self._calls.get("node", "", "event_set", nv.nvmlEventSetCreate)
        if isinstance(self._events, Absent):
            self._events = None
            return
        for d in self._devices:
            if d is not None:
                self._calls.get(f"gpu {d.index}", d.uuid, "xid_events",
                                nv.nvmlDeviceRegisterEvents, d.handle, XID_CRITICAL,
                                self._events)

    def close(self) -> None:
        if not self._initialized:
            return
        nv = self._nvml
        self._initialized = False
        for d in self._devices:
            if d is not None:
                with contextlib.suppress(GpuLost, BackendDown):  # buffers go with the driver
                    release(self._calls, d)
        try:
            if self._events is not None:
                nv.nvmlEventSetFree(self._events)
            nv.nvmlShutdown()
        except nv.NVMLError as exc:
            log.debug("NVML shutdown: %s", error_name(nv, error_code(exc)))
        self._events = None
        self._devices = []

    # -- sampling -----------------------------------------------------------------------

    def sample(self) -> NodeSnapshot:
        began = self._monotonic()
        taken_at = self._clock()
        c = self._calls
        c.begin_tick()
        try:
            if not self._initialized:
                self._init()
            self._check_count()
            self._drain_xid_events()
            gpus = tuple(self._read(d, i, began) for i, d in enumerate(self._devices))
        except (BackendDown, self._nvml.NVMLError) as exc:
            reason = (str(exc) if isinstance(exc, BackendDown)
                      else error_name(self._nvml, error_code(exc)))
            c.note("node", "nvml", f"unavailable: {reason}")
            self.close()
            return NodeSnapshot(node=self._node, backend=self.name, taken_at=taken_at,
                                monotonic=began, state=BackendState.UNAVAILABLE,
                                reason=reason, duration_seconds=self._monotonic() - began)
        c.cleared("node", "nvml")
        return NodeSnapshot(node=self._node, backend=self.name, taken_at=taken_at,
                            monotonic=began, driver_version=self._driver, gpus=gpus,
                            duration_seconds=self._monotonic() - began,
                            problems=tuple(c.problems))

    def _check_count(self) -> None:
        count = int(self._nvml.nvmlDeviceGetCount())
        if count != len(self._devices):
            raise BackendDown(f"GPU count changed from {len(self._devices)} to {count}")

    def _read(self, d: DeviceState | None, index: int, now: float) -> GpuSample:
        if d is None:
            return _absent_gpu(index, "", GpuState.UNAVAILABLE, Absent.UNAVAILABLE)
        try:
            sample = read_device(self._calls, d, self._interval, self._pcie, now,
                                 self._mig_refresh_s)
        except GpuLost:
            self._calls.note(f"gpu {d.index}", "state", f"GPU {d.uuid} is lost",
                             logging.ERROR)
            return _absent_gpu(d.index, d.uuid, GpuState.LOST, Absent.LOST, d)
        self._calls.cleared(f"gpu {d.index}", "state")
        return sample

    def _drain_xid_events(self) -> None:
        if self._events is None:
            return
        nv = self._nvml
        by_ptr = {pointer_value(d.handle): d for d in self._devices if d is not None}
        for _ in range(MAX_EVENTS_PER_TICK):
            try:
                ev = nv.nvmlEventSetWait(self._events, 0)
            except nv.NVMLError as exc:
                code = error_code(exc)
                if code != TIMEOUT:  # TIMEOUT: no event pending
                    self._calls.failed("node", "", "xid_events", code)
                return
            d = by_ptr.get(pointer_value(ev.device))
            if d is not None and ev.eventType & XID_CRITICAL:
                d.xid_total += 1
                d.last_xid = int(ev.eventData)
                log.warning("gpu %d (%s): XID %d", d.index, d.uuid, d.last_xid)


def _absent_gpu(index: int, uuid: str, state: GpuState, why: Absent,
                d: DeviceState | None = None) -> GpuSample:
    # The MIG instances last enumerated stay in the sample, their readings Absent too, so
    # that a pod on one reads as lost rather than as holding a device that is not there.
    migs = tuple(MigSample(m.uuid, uuid, m.index, m.gpu_instance_id, m.compute_instance_id,
                           m.profile, why, why, why, (), why)
                 for m in (d.migs if d is not None and d.mig_enabled else ()))
    return GpuSample(
        index=index, uuid=uuid, name=d.name if d else "", pci_bus_id=d.pci_bus_id if d else "",
        minor_number=d.minor_number if d else index, state=state, utilization_percent=why,
        memory_util_percent=why, memory_used_bytes=why, memory_free_bytes=why,
        memory_total_bytes=why, memory_reserved_bytes=why, power_watts=why,
        power_limit_watts=why, temperature_c=why, sm_clock_mhz=why, energy_millijoules=why,
        nvlink_tx_bytes_per_second=why, nvlink_rx_bytes_per_second=why,
        pcie_tx_bytes_per_second=why, pcie_rx_bytes_per_second=why,
        xid_errors_total=d.xid_total if d else 0, last_xid=d.last_xid if d else 0,
        mig_enabled=d.mig_enabled if d else False,
        sharing=d.sharing if d else SharingMode.EXCLUSIVE, migs=migs, processes_unknown=why)

