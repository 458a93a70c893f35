"""Which processes use a GPU or MIG instance, and each one's SM and memory utilization,
from NVML.

Runs in the sampler's worker thread through ``NvmlCalls``; nothing raises an NVML error to the
caller (see nvml_calls).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gpuscale.telemetry.model import Absent, ProcessSample, Reading
from gpuscale.telemetry.nvml_calls import NOT_FOUND, SUCCESS, NvmlCalls, error_code
from gpuscale.telemetry.nvml_state import UINT_MAX, DeviceState

MAX_PROCESSES = 1024  # per device, bounded whatever the driver returns


def listed_processes(c: NvmlCalls, where: str, uuid: str,
                     handle: Any) -> list[ProcessSample] | Absent:
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


def with_utilization(listed: list[ProcessSample],
                      util: dict[int, tuple[Reading, Reading]] | Absent,
                      ) -> tuple[ProcessSample, ...]:
    """The listed processes with their SM and memory %, or every one with the reason there
    is none."""
    out = []
    for p in listed:
        sm, mu = (util, util) if isinstance(util, Absent) else util[p.pid]
        out.append(replace(p, sm_util_percent=sm, mem_util_percent=mu))
    return tuple(out)


def process_utilization(c: NvmlCalls, d: DeviceState, pids: list[int], mps: set[int],
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

