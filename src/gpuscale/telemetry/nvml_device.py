"""Per-device NVML reads: one physical GPU's readings, with its cursors, and the process
and MIG reads (nvml_processes, nvml_mig) it is made of.

Everything here runs in the sampler's worker thread through ``NvmlCalls``; nothing raises an
NVML error to the caller (see nvml_calls).
"""

from __future__ import annotations

import ctypes
from typing import Any

from gpuscale.telemetry.model import (
    Absent,
    GpuSample,
    IntReading,
    MigSample,
    Reading,
)
from gpuscale.telemetry.nvml_calls import (
    ARGUMENT_VERSION_MISMATCH,
    FUNCTION_NOT_FOUND,
    NOT_FOUND,
    SUCCESS,
    NvmlCalls,
    error_code,
)
from gpuscale.telemetry.nvml_mig import MIG_REFRESH_S, read_migs
from gpuscale.telemetry.nvml_processes import (
    listed_processes,
    process_utilization,
    with_utilization,
)
from gpuscale.telemetry.nvml_state import UINT_MAX, DeviceState

NVLINK_TX, NVLINK_RX = 138, 139  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_{TX,RX}, KiB counters


def read_device(c: NvmlCalls, d: DeviceState, interval: float, pcie: bool,
                monotonic: float, mig_refresh_s: float = MIG_REFRESH_S) -> GpuSample:
    nv = c.nvml
    where, u = f"gpu {d.index}", d.uuid
    util, n_samples = _window_utilization(c, d, interval)
    # Where the driver's sample grid stands (what per-process utilization is read against),
    # or why it is not known this tick.
    grid: int | Absent = d.util_cursor if not isinstance(util, Absent) or (
        util is Absent.NO_DATA) else util
    rates = c.get(where, u, "utilization_rates", nv.nvmlDeviceGetUtilizationRates, d.handle)
    mem_util: Reading = rates if isinstance(rates, Absent) else float(rates.memory)
    if n_samples == 0 and not isinstance(rates, Absent) and not d.mig_enabled:
        util = float(rates.gpu)  # no new driver sample in the window: its latest value
    elif isinstance(util, Absent) and isinstance(rates, Absent):
        util = rates
    used, free, total, reserved = _memory(c, d)
    power = _scaled(c.get(where, u, "power", nv.nvmlDeviceGetPowerUsage, d.handle), 1e-3)
    limit = _scaled(c.get(where, u, "power_limit", nv.nvmlDeviceGetEnforcedPowerLimit,
                          d.handle), 1e-3)
    temp = _scaled(c.get(where, u, "temperature", nv.nvmlDeviceGetTemperature, d.handle,
                         nv.NVML_TEMPERATURE_GPU), 1.0)
    clock = _scaled(c.get(where, u, "sm_clock", nv.nvmlDeviceGetClockInfo, d.handle,
                          nv.NVML_CLOCK_SM), 1.0)
    energy = c.get(where, u, "energy", nv.nvmlDeviceGetTotalEnergyConsumption, d.handle)
    nv_tx, nv_rx = _nvlink(c, d, monotonic)
    pcie_tx: Reading = Absent.UNSUPPORTED
    pcie_rx: Reading = Absent.UNSUPPORTED
    if pcie:  # each call blocks ~20 ms in the driver: only on request
        pcie_tx = _scaled(c.get(where, u, "pcie_tx", nv.nvmlDeviceGetPcieThroughput, d.handle,
                                nv.NVML_PCIE_UTIL_TX_BYTES), 1024.0)
        pcie_rx = _scaled(c.get(where, u, "pcie_rx", nv.nvmlDeviceGetPcieThroughput, d.handle,
                                nv.NVML_PCIE_UTIL_RX_BYTES), 1024.0)
    migs: tuple[MigSample, ...] = ()
    unknown: Absent | None = None
    if d.mig_enabled:
        migs = read_migs(c, d, monotonic, mig_refresh_s)
        processes = tuple(p for m in migs for p in m.processes)
        unknown = next((m.processes_unknown for m in migs
                        if m.processes_unknown is not None), None)
    else:
        listed = listed_processes(c, where, u, d.handle)
        if isinstance(listed, Absent):
            processes, unknown = (), listed
        else:
            processes = with_utilization(
                listed, process_utilization(c, d, [p.pid for p in listed],
                                      {p.pid for p in listed if p.mps_client}, grid, interval))
    return GpuSample(
        index=d.index, uuid=d.uuid, name=d.name, pci_bus_id=d.pci_bus_id,
        minor_number=d.minor_number, utilization_percent=util, utilization_samples=n_samples,
        memory_util_percent=mem_util, memory_used_bytes=used, memory_free_bytes=free,
        memory_total_bytes=total, memory_reserved_bytes=reserved, power_watts=power,
        power_limit_watts=limit, temperature_c=temp, sm_clock_mhz=clock,
        energy_millijoules=energy if isinstance(energy, Absent) else int(energy),
        nvlink_tx_bytes_per_second=nv_tx, nvlink_rx_bytes_per_second=nv_rx,
        pcie_tx_bytes_per_second=pcie_tx, pcie_rx_bytes_per_second=pcie_rx,
        xid_errors_total=d.xid_total, last_xid=d.last_xid, mig_enabled=d.mig_enabled,
        sharing=d.sharing, migs=migs, processes=processes, processes_unknown=unknown)


def _scaled(value: Any, factor: float) -> Reading:
    return value if isinstance(value, Absent) else float(value) * factor


def _sample_value(value_type: int, v: Any) -> float:
    """The number in an nvmlValue_t union, by NVML_VALUE_TYPE_*."""
    return float({0: v.dVal, 1: v.uiVal, 2: v.ulVal, 3: v.ullVal, 4: v.sllVal,
                  5: v.siVal, 6: v.usVal}.get(value_type, v.uiVal))


def _window_utilization(c: NvmlCalls, d: DeviceState, interval: float) -> tuple[Reading, int]:
    """Mean of the driver's utilization samples newer than the cursor.

    The first read takes only the samples in the last ``interval`` (the buffer holds many
    seconds). ``(NO_DATA, 0)`` when no new sample arrived - the caller then uses the driver's
    latest value from nvmlDeviceGetUtilizationRates.
    """
    nv, where = c.nvml, f"gpu {d.index}"
    if (d.uuid, "utilization_samples") in c.unsupported:
        return Absent.UNSUPPORTED, 0
    try:
        vtype, samples = nv.nvmlDeviceGetSamples(d.handle, nv.NVML_GPU_UTILIZATION_SAMPLES,
                                                 d.util_cursor)
    except nv.NVMLError as exc:
        code = error_code(exc)
        if code == NOT_FOUND:  # nothing new since the cursor: not an error
            return Absent.NO_DATA, 0
        return c.failed(where, d.uuid, "utilization_samples", code), 0
    fresh = [s for s in samples if s.timeStamp > d.util_cursor]
    if not fresh:
        return Absent.NO_DATA, 0
    newest = max(s.timeStamp for s in fresh)
    if d.util_cursor == 0:
        fresh = [s for s in fresh if s.timeStamp > newest - interval * 1e6]
    d.util_cursor = newest
    values = [_sample_value(vtype, s.sampleValue) for s in fresh]
    return sum(values) / len(values), len(values)


def _memory(c: NvmlCalls, d: DeviceState) -> tuple[IntReading, IntReading, IntReading, IntReading]:
    nv, where = c.nvml, f"gpu {d.index}"
    if d.memory_v2:
        try:
            m = nv.nvmlDeviceGetMemoryInfo(d.handle, version=nv.nvmlMemory_v2)
            c.cleared(where, "memory")
            return int(m.used), int(m.free), int(m.total), int(m.reserved)
        except nv.NVMLError as exc:
            if error_code(exc) not in (FUNCTION_NOT_FOUND, ARGUMENT_VERSION_MISMATCH):
                a = c.failed(where, d.uuid, "memory", error_code(exc))
                return a, a, a, a
            d.memory_v2 = False  # older driver: the v1 call has no "reserved"
    m1 = c.get(where, d.uuid, "memory", nv.nvmlDeviceGetMemoryInfo, d.handle)
    if isinstance(m1, Absent):
        return m1, m1, m1, m1
    return int(m1.used), int(m1.free), int(m1.total), Absent.UNSUPPORTED


def _nvlink(c: NvmlCalls, d: DeviceState, now: float) -> tuple[Reading, Reading]:
    """NVLink data throughput from the aggregate KiB counters, differenced between ticks."""
    nv, where = c.nvml, f"gpu {d.index}"
    vals = c.get(where, d.uuid, "nvlink", nv.nvmlDeviceGetFieldValues, d.handle,
                 [(NVLINK_TX, UINT_MAX), (NVLINK_RX, UINT_MAX)])
    if isinstance(vals, Absent):
        return vals, vals
    for v in vals:
        if v.nvmlReturn != SUCCESS:
            a = c.failed(where, d.uuid, "nvlink", int(v.nvmlReturn))
            return a, a
    tx, rx = int(vals[0].value.ullVal), int(vals[1].value.ullVal)
    prev, d.nvlink_prev = d.nvlink_prev, (now, tx, rx)
    if prev is None or now <= prev[0] or tx < prev[1] or rx < prev[2]:
        return Absent.NO_DATA, Absent.NO_DATA  # first read, or the counter was reset
    dt = now - prev[0]
    return (tx - prev[1]) * 1024.0 / dt, (rx - prev[2]) * 1024.0 / dt


def pointer_value(handle: Any) -> int:
    """The address behind an nvmlDevice_t, to match event data to a device."""
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)

