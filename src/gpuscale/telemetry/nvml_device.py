"""Per-device NVML reads: one physical GPU and its MIG instances, with their cursors.

Everything here runs in the sampler's worker thread through ``Calls``; nothing raises an
NVML error to the caller (see nvml_calls).
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass, field, replace
from typing import Any

from gpuscale.telemetry.model import (
    Absent,
    GpuSample,
    IntReading,
    MigSample,
    ProcessSample,
    Reading,
    SharingMode,
)
from gpuscale.telemetry.nvml_calls import (
    ARGUMENT_VERSION_MISMATCH,
    FUNCTION_NOT_FOUND,
    NOT_FOUND,
    SUCCESS,
    Calls,
    error_code,
)

UINT_MAX = 0xFFFFFFFF
NVLINK_TX, NVLINK_RX = 138, 139  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_{TX,RX}, KiB counters
MIG_REFRESH_S = 30.0  # MIG layouts change rarely; re-enumerate this often (or on error)
MAX_PROCESSES = 1024  # per device, bounded whatever the driver returns


@dataclass
class MigState:
    index: int
    handle: Any
    uuid: str
    gpu_instance_id: int
    compute_instance_id: int
    profile: str
    # Two GPM sample buffers, allocated once and swapped each tick: "prev" holds the last
    # tick's sample (valid when gpm_primed), "spare" receives this tick's.
    gpm_prev: Any = None
    gpm_spare: Any = None
    gpm_primed: bool = False


@dataclass
class DeviceState:
    """Static facts and cursors for one GPU across ticks."""

    index: int
    handle: Any
    uuid: str
    name: str
    pci_bus_id: str
    minor_number: int
    mig_enabled: bool
    sharing: SharingMode
    util_cursor: int = 0  # last driver sample timestamp seen (us)
    proc_cursor: int = 0  # per-process utilization read up to here (driver us)
    proc_last: dict[int, tuple[Reading, Reading]] = field(default_factory=dict)  # pid -> the
    #   (sm %, mem %) of the last window that ended on a new driver sample
    nvlink_prev: tuple[float, int, int] | None = None  # (monotonic, tx KiB, rx KiB)
    memory_v2: bool = True  # falls back to v1 on drivers without the v2 call
    gpm: bool | None = None  # None = not asked yet
    migs: list[MigState] = field(default_factory=list)
    migs_read_at: float = -1e18
    xid_total: int = 0
    last_xid: int = 0


def read_device(c: Calls, d: DeviceState, interval: float, pcie: bool,
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
        migs = _read_migs(c, d, monotonic, mig_refresh_s)
        processes = tuple(p for m in migs for p in m.processes)
        unknown = next((m.processes_unknown for m in migs
                        if m.processes_unknown is not None), None)
    else:
        listed = _listed(c, where, u, d.handle)
        if isinstance(listed, Absent):
            processes, unknown = (), listed
        else:
            processes = _with_utilization(
                listed, _process_util(c, d, [p.pid for p in listed],
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


def _window_utilization(c: Calls, d: DeviceState, interval: float) -> tuple[Reading, int]:
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


def _memory(c: Calls, d: DeviceState) -> tuple[IntReading, IntReading, IntReading, IntReading]:
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


def _nvlink(c: Calls, d: DeviceState, now: float) -> tuple[Reading, Reading]:
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


def _listed(c: Calls, where: str, uuid: str, handle: Any) -> list[ProcessSample] | Absent:
    """The processes with a compute, graphics or MPS compute context on the device (a
    process with several once), at most MAX_PROCESSES, their utilization not filled in yet.

    Under MPS the compute listing shows only the MPS server, which owns the one context on
    the GPU ("nvidia-cuda-mps-server will appear as the active CUDA process rather than any
    of the client processes", NVIDIA's MPS documentation); the clients - the pods' own
    processes - are what nvmlDeviceGetMPSComputeRunningProcesses lists ("processes with a
    Multi-Process Service (MPS) compute context on a device", the NVML reference).

    Absent when the list cannot be known: the compute or MPS listing failed or is
    unsupported, or the graphics listing failed. A driver that cannot list graphics
    contexts at all (unsupported) has the rest taken as the whole. Not so for MPS: nothing
    in NVML says whether a GPU is shared through MPS (the server looks like any compute
    process), so without the MPS listing its clients - the pods' processes - may be unseen.
    """
    nv = c.nvml
    found: dict[int, ProcessSample] = {}
    for what, fn in (("processes", nv.nvmlDeviceGetComputeRunningProcesses),
                     ("graphics_processes", nv.nvmlDeviceGetGraphicsRunningProcesses),
                     ("mps_processes", nv.nvmlDeviceGetMPSComputeRunningProcesses)):
        procs = c.get(where, uuid, what, fn, handle)
        if procs is Absent.UNSUPPORTED and what == "graphics_processes":
            continue
        if isinstance(procs, Absent):
            return procs
        for p in procs:
            pid, mem = int(p.pid), p.usedGpuMemory
            mps = what == "mps_processes" or (pid in found and found[pid].mps_client)
            if pid in found and not isinstance(found[pid].used_memory_bytes, Absent):
                # several contexts: usedGpuMemory is the process's whole use either way
                found[pid] = replace(found[pid], mps_client=mps)
                continue
            if pid not in found and len(found) >= MAX_PROCESSES:
                continue
            found[pid] = ProcessSample(
                pid, Absent.UNAVAILABLE if mem is None else int(mem), Absent.NO_DATA,
                Absent.NO_DATA, p.gpuInstanceId if p.gpuInstanceId != UINT_MAX else None,
                p.computeInstanceId if p.computeInstanceId != UINT_MAX else None, mps)
    return list(found.values())


def _with_utilization(listed: list[ProcessSample],
                      util: dict[int, tuple[Reading, Reading]] | Absent,
                      ) -> tuple[ProcessSample, ...]:
    """The listed processes with their SM and memory %, or every one with the reason there
    is none."""
    out = []
    for p in listed:
        sm, mu = (util, util) if isinstance(util, Absent) else util[p.pid]
        out.append(replace(p, sm_util_percent=sm, mem_util_percent=mu))
    return tuple(out)


def _process_util(c: Calls, d: DeviceState, pids: list[int], mps: set[int],
                  grid: int | Absent, interval: float,
                  ) -> dict[int, tuple[Reading, Reading]] | Absent:
    """SM and memory % of each listed pid over the window since the last read.

    What a real H100 (driver 580.159.04) does, which wins over the NVML reference where they
    differ: nvmlDeviceGetProcessUtilization returns at most one entry per pid, its mean
    activity since the ``lastSeenTimeStamp`` passed, stamped on the same sample grid as
    nvmlDeviceGetSamples (the same microsecond timestamps); a pid that did no work since
    then has no entry, and with no entry at all the call fails NOT_FOUND. Passing 0 gives a
    long-window (~14 s) average instead - 46 % for a process then at 99 % - so the window
    is placed on the device sample grid this tick already read (``grid``, the newest
    nvmlDeviceGetSamples timestamp): the first read starts ``interval`` before it, and every
    read moves the cursor up to it.

    So when a new grid sample ended in the window, a listed pid without an entry used 0.0.
    When none did (a tick shorter than the driver's sample period), the last window's values
    stand and a pid new since then reads NO_DATA. Absent for all, never 0, when the window
    cannot be placed (``grid`` is the device samples' reason, or 0: none read yet) and when
    the call failed or is not available.

    MPS clients (``mps``): the NVML reference does not say whether the driver samples an
    MPS client on its own or books its work to the MPS server's pid; no real MPS node has
    been measured. A client with its own entry reads it. One without, while a listed
    process that is no client (the server) has an entry, may have done that work: SHARED,
    never 0. Without such an entry the device did no work through the server, and the
    client used 0.0 as any unsampled process.
    """
    nv, where = c.nvml, f"gpu {d.index}"
    if (d.uuid, "process_utilization") in c.unsupported:
        return Absent.UNSUPPORTED
    if isinstance(grid, Absent):
        return grid
    if grid == 0:
        return Absent.NO_DATA
    cursor = d.proc_cursor or grid - int(interval * 1e6)
    samples: list[Any] = []
    try:
        samples = nv.nvmlDeviceGetProcessUtilization(d.handle, cursor)
    except nv.NVMLError as exc:
        code = error_code(exc)
        # NOT_FOUND: no process did work since the cursor. SUCCESS: pynvml raises it when
        # the sizing call reports no entry (the H100 never did: it sizes 72, then answers
        # NOT_FOUND).
        if code not in (NOT_FOUND, SUCCESS):
            return c.failed(where, d.uuid, "process_utilization", code)
    c.cleared(where, "process_utilization")
    fresh: dict[int, Any] = {}
    for s in samples:  # one entry per pid; should a driver give more, its newest counts
        pid = int(s.pid)
        if s.timeStamp > cursor and (pid not in fresh or s.timeStamp > fresh[pid].timeStamp):
            fresh[pid] = s
    if grid > cursor or fresh:  # a driver sample ended in the window: the unsampled idled
        d.proc_cursor = max([grid, *(int(s.timeStamp) for s in fresh.values())])
        booked = bool(mps) and any(pid in fresh and pid not in mps for pid in pids)
        d.proc_last = {pid: ((float(fresh[pid].smUtil), float(fresh[pid].memUtil))
                             if pid in fresh else _unsampled(pid in mps and booked))
                       for pid in pids}
    return {pid: d.proc_last.get(pid, (Absent.NO_DATA, Absent.NO_DATA)) for pid in pids}


def _unsampled(maybe_booked_to_server: bool) -> tuple[Reading, Reading]:
    """(sm %, mem %) of a listed process the driver gave no entry in a window that ended on
    a new sample: idle, unless its work may have been booked to its MPS server."""
    if maybe_booked_to_server:
        return Absent.SHARED, Absent.SHARED
    return 0.0, 0.0


def _read_migs(c: Calls, d: DeviceState, now: float,
               refresh_s: float) -> tuple[MigSample, ...]:
    if now - d.migs_read_at >= refresh_s:
        _enumerate_migs(c, d)
        d.migs_read_at = now
    nv, out = c.nvml, []
    if d.gpm is None:
        sup = c.get(f"gpu {d.index}", d.uuid, "gpm", nv.nvmlGpmQueryDeviceSupport, d.handle)
        d.gpm = not isinstance(sup, Absent) and bool(sup.isSupportedDevice)
    for m in d.migs:
        where = f"gpu {d.index} mig {m.gpu_instance_id}"
        mem = c.get(where, m.uuid, "memory", nv.nvmlDeviceGetMemoryInfo, m.handle)
        used: IntReading = mem if isinstance(mem, Absent) else int(mem.used)
        total: IntReading = mem if isinstance(mem, Absent) else int(mem.total)
        # No per-process utilization on MIG (NOT_SUPPORTED): its processes' SM % is
        # UNSUPPORTED, never the 0 of an unsampled process.
        listed = _listed(c, where, m.uuid, m.handle)
        procs = () if isinstance(listed, Absent) else tuple(
            replace(p, sm_util_percent=Absent.UNSUPPORTED, mem_util_percent=Absent.UNSUPPORTED,
                    gpu_instance_id=m.gpu_instance_id,
                    compute_instance_id=m.compute_instance_id) for p in listed)
        out.append(MigSample(m.uuid, d.uuid, m.index, m.gpu_instance_id,
                             m.compute_instance_id, m.profile, used, total,
                             _gpm_util(c, d, m) if d.gpm else Absent.UNSUPPORTED, procs,
                             listed if isinstance(listed, Absent) else None))
        if mem is Absent.UNAVAILABLE:
            d.migs_read_at = -1e18  # the instance may be gone: re-enumerate next tick
    return tuple(out)


def _enumerate_migs(c: Calls, d: DeviceState) -> None:
    """Re-read the MIG layout; instances that are still there keep their GPM buffers.

    The layout is replaced only when fully read: a GPU lost half-way keeps its last layout
    (and the buffers it owns) to report as lost and to free on close.
    """
    nv, where = c.nvml, f"gpu {d.index}"
    old = {(m.uuid, m.gpu_instance_id, m.compute_instance_id): m for m in d.migs}
    fresh: list[MigState] = []
    count = c.get(where, d.uuid, "mig_count", nv.nvmlDeviceGetMaxMigDeviceCount, d.handle)
    mem = c.get(where, d.uuid, "memory_v1", nv.nvmlDeviceGetMemoryInfo, d.handle)
    parent_total = 0 if isinstance(mem, Absent) else int(mem.total)
    for i in range(0 if isinstance(count, Absent) else int(count)):
        try:
            h = nv.nvmlDeviceGetMigDeviceHandleByIndex(d.handle, i)
        except nv.NVMLError as exc:
            if error_code(exc) != NOT_FOUND:  # NOT_FOUND: no instance in this position
                c.failed(where, d.uuid, f"mig {i}", error_code(exc))
            continue
        mw = f"{where} mig-index {i}"
        uuid = c.get(mw, d.uuid, "mig_uuid", nv.nvmlDeviceGetUUID, h)
        gi = c.get(mw, d.uuid, "gpu_instance_id", nv.nvmlDeviceGetGpuInstanceId, h)
        ci = c.get(mw, d.uuid, "compute_instance_id", nv.nvmlDeviceGetComputeInstanceId, h)
        if isinstance(uuid, Absent) or isinstance(gi, Absent) or isinstance(ci, Absent):
            continue
        key = (text(uuid), int(gi), int(ci))
        kept = old.pop(key, None)
        if kept is not None:
            kept.index, kept.handle = i, h
            fresh.append(kept)
        else:
            fresh.append(MigState(i, h, *key, _profile(c, mw, d, h, parent_total)))
    d.migs = fresh
    for gone in old.values():
        _free_gpm(c, gone)


def _profile(c: Calls, where: str, d: DeviceState, handle: Any, parent_total: int) -> str:
    """MIG profile name as NVIDIA's device plugin spells it: ``<g>g.<GB>gb``, with a
    ``<c>c.`` prefix when the compute instance has fewer slices than its GPU instance.

    GB is the instance's share of the parent's memory rounded up to eighths, times the
    parent's memory in whole GB (so a 9984 MiB slice of an 80 GB H100 is "10gb").
    """
    attrs = c.get(where, d.uuid, "mig_attributes", c.nvml.nvmlDeviceGetAttributes, handle)
    if isinstance(attrs, Absent):
        return "unknown"
    g, ci = int(attrs.gpuInstanceSliceCount), int(attrs.computeInstanceSliceCount)
    gb = mig_memory_gb(int(attrs.memorySizeMB), parent_total)
    return f"{g}g.{gb}gb" if ci in (0, g) else f"{ci}c.{g}g.{gb}gb"


def mig_memory_gb(instance_mib: int, parent_total_bytes: int) -> int:
    if parent_total_bytes <= 0:
        return (instance_mib + 1023) // 1024
    fraction = math.ceil(instance_mib * 2**20 / parent_total_bytes * 8) / 8
    parent_gb = (parent_total_bytes + 2**30 - 1) // 2**30
    return round(fraction * parent_gb)


def _gpm_util(c: Calls, d: DeviceState, m: MigState) -> Reading:
    """Graphics-engine activity (0-100) of one MIG instance between two GPM samples."""
    nv, where = c.nvml, f"gpu {d.index} mig {m.gpu_instance_id}"
    if m.gpm_prev is None:
        bufs = [c.get(where, m.uuid, "gpm_alloc", nv.nvmlGpmSampleAlloc) for _ in range(2)]
        for b in bufs:
            if isinstance(b, Absent):
                for other in bufs:
                    if not isinstance(other, Absent):
                        c.get(where, m.uuid, "gpm_free", nv.nvmlGpmSampleFree, other)
                return b
        m.gpm_prev, m.gpm_spare, m.gpm_primed = bufs[0], bufs[1], False
    got = c.get(where, m.uuid, "gpm_sample", nv.nvmlGpmMigSampleGet, d.handle,
                m.gpu_instance_id, m.gpm_spare)
    if isinstance(got, Absent):
        m.gpm_primed = False
        return got
    prev, cur = m.gpm_prev, m.gpm_spare
    m.gpm_prev, m.gpm_spare = cur, prev
    if not m.gpm_primed:
        m.gpm_primed = True
        return Absent.NO_DATA  # a rate needs two samples
    req = nv.c_nvmlGpmMetricsGet_t()
    req.version = nv.NVML_GPM_METRICS_GET_VERSION
    req.numMetrics = 1
    req.sample1, req.sample2 = prev, cur
    req.metrics[0].metricId = nv.NVML_GPM_METRIC_GRAPHICS_UTIL
    res = c.get(where, m.uuid, "gpm_metrics", nv.nvmlGpmMetricsGet, req)
    if isinstance(res, Absent):
        return res
    metric = res.metrics[0]
    if metric.nvmlReturn != SUCCESS:
        return c.failed(where, m.uuid, "gpm_metrics", int(metric.nvmlReturn))
    return min(100.0, max(0.0, float(metric.value)))


def release(c: Calls, d: DeviceState) -> None:
    """Free what NVML allocated for this device (GPM buffers); call before nvmlShutdown."""
    for m in d.migs:
        _free_gpm(c, m)


def _free_gpm(c: Calls, m: MigState) -> None:
    for buf in (m.gpm_prev, m.gpm_spare):
        if buf is not None:
            c.get("mig", m.uuid, "gpm_free", c.nvml.nvmlGpmSampleFree, buf)
    m.gpm_prev = m.gpm_spare = None
    m.gpm_primed = False


def text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def pointer_value(handle: Any) -> int:
    """The address behind an nvmlDevice_t, to match event data to a device."""
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)

