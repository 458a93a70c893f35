"""A MIG-enabled GPU's instances from NVML: the layout (re-read now and then), each
instance's memory and processes, and its GPM graphics activity.

Runs in the sampler's worker thread through ``NvmlCalls``; nothing raises an NVML error to the
caller (see nvml_calls).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from gpuscale.telemetry.model import Absent, IntReading, MigSample, Reading
from gpuscale.telemetry.nvml_calls import NOT_FOUND, SUCCESS, NvmlCalls, error_code
from gpuscale.telemetry.nvml_processes import listed_processes
from gpuscale.telemetry.nvml_state import DeviceState, MigState, text

MIG_REFRESH_S = 30.0  # MIG layouts change rarely; re-enumerate this often (or on error)


def read_migs(c: NvmlCalls, d: DeviceState, now: float,
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
        listed = listed_processes(c, where, m.uuid, m.handle)
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


def _enumerate_migs(c: NvmlCalls, d: DeviceState) -> None:
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


def _profile(c: NvmlCalls, where: str, d: DeviceState, handle: Any, parent_total: int) -> str:
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


def _gpm_util(c: NvmlCalls, d: DeviceState, m: MigState) -> Reading:
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


def release(c: NvmlCalls, d: DeviceState) -> None:
    """Free what NVML allocated for this device (GPM buffers); call before nvmlShutdown."""
    for m in d.migs:
        _free_gpm(c, m)


def _free_gpm(c: NvmlCalls, m: MigState) -> None:
    for buf in (m.gpm_prev, m.gpm_spare):
        if buf is not None:
            c.get("mig", m.uuid, "gpm_free", c.nvml.nvmlGpmSampleFree, buf)
    m.gpm_prev = m.gpm_spare = None
    m.gpm_primed = False
