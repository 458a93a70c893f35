"""What the AMD backend makes of the ``amdsmi`` package's answers (pure): a call's dict or
number -> the readings of ``telemetry.model``, and the samples of a GPU that is lost or whose
identity cannot be read. No library call happens here.

Units: the library's activity is 0-100, its VRAM byte counts are bytes, socket power is
watts, and the power cap inside ``amdsmi_power_info_t`` (``power_limit``) is the hwmon
``power1_cap`` in microwatts - amdsmi.h's comment says watts, but the library copies the
hwmon file unchanged (ROCm/amdsmi#174; ROCm/rocm-systems#5037, closed with a fix of the
comment; ``amdsmi_power_cap_info_t`` documents the same cap as uW on bare metal).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuscale.telemetry.model import (
    Absent,
    GpuSample,
    GpuState,
    MigSample,
)

MIB = 1024 * 1024
NA = 0xFFFF  # what the library writes into a field it cannot fill
U64_NA = 2**64 - 1  # an accumulator the metrics table does not fill
#: A power cap outside this range (watts) is not a cap: a library that gives the field in
#: watts after all (750 read as uW is 0.00075 W), or a garbled read.
POWER_CAP_RANGE_W = (1.0, 5000.0)


@dataclass(frozen=True, slots=True)
class Processor:
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


def field(got: Any, key: str, scale: float = 1.0) -> float | Absent:
    """A numeric field of a call's dict: the call's Absent, the library's N/A, or the
    number times ``scale``."""
    if isinstance(got, Absent):
        return got
    if not isinstance(got, dict):
        return Absent.UNAVAILABLE
    value = got.get(key)
    if value in ("N/A", None) or value == NA:
        return Absent.UNSUPPORTED
    if not isinstance(value, int | float) or isinstance(value, bool):
        return Absent.UNAVAILABLE
    return float(value) * scale


def power_cap_watts(power: Any) -> float | Absent:
    """The power cap from ``amdsmi_get_power_info``'s ``power_limit`` (microwatts, see the
    module's text) in watts; UNAVAILABLE when the result is no plausible cap."""
    cap = field(power, "power_limit", 1e-6)
    if isinstance(cap, Absent):
        return cap
    low, high = POWER_CAP_RANGE_W
    return cap if low <= cap <= high else Absent.UNAVAILABLE


def count(value: Any) -> int | Absent:
    """A byte count from the library: the Absent of a failed call, or the integer."""
    if isinstance(value, Absent):
        return value
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return int(value) if ok else Absent.UNAVAILABLE


def percent(value: float | Absent) -> float | Absent:
    """An activity: above 100 it is not one (a reading the library garbled)."""
    return Absent.UNAVAILABLE if not isinstance(value, Absent) and value > 100 else value


def process_bytes(value: Any) -> int | Absent:
    """A process's VRAM: a byte count, or UNSUPPORTED when the entry has none."""
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return int(value) if ok else Absent.UNSUPPORTED


def isum(values: list[int | Absent]) -> int | Absent:
    """A sum of byte counts, or the first reason one is missing."""
    missing = next((v for v in values if isinstance(v, Absent)), None)
    return missing if missing is not None else sum(v for v in values
                                                   if not isinstance(v, Absent))


def sample(index: int, uuid: str, name: str, bdf: str, activity: Any, used: int | Absent,
           total: int | Absent, power: Any, temp: Any, **rest: Any) -> GpuSample:
    """A GPU's sample from its calls' results (each a value or the Absent its call gave)."""
    return GpuSample(
        index=index, uuid=uuid, name=name, pci_bus_id=bdf, minor_number=-1,
        utilization_percent=percent(field(activity, "gfx_activity")),
        memory_util_percent=percent(field(activity, "umc_activity")),
        memory_used_bytes=used, memory_total_bytes=total,
        memory_free_bytes=(total - used if not isinstance(total, Absent)
                           and not isinstance(used, Absent) else Absent.UNAVAILABLE),
        power_watts=field(power, "current_socket_power"),
        power_limit_watts=power_cap_watts(power),
        temperature_c=temp if isinstance(temp, Absent) else float(temp), **rest)


def lost_gpu(index: int, uuid: str, name: str, bdf: str) -> GpuSample:
    return GpuSample(index=index, uuid=uuid, name=name, pci_bus_id=bdf, minor_number=-1,
                     state=GpuState.LOST, utilization_percent=Absent.LOST,
                     memory_util_percent=Absent.LOST, memory_used_bytes=Absent.LOST,
                     memory_total_bytes=Absent.LOST, power_watts=Absent.LOST,
                     temperature_c=Absent.LOST, processes_unknown=Absent.LOST)


def lost_partition(pid: int, m: Processor, parent: str, profile: str,
                   name: str) -> MigSample:
    """A partition whose GPU fell off the bus: it keeps its name, so its pods read lost."""
    return MigSample(uuid=partition_key(m.uuid, parent, pid), parent_uuid=parent,
                     index=max(pid, 0), gpu_instance_id=pid, compute_instance_id=0,
                     profile=profile, memory_used_bytes=Absent.LOST,
                     memory_total_bytes=Absent.LOST, utilization_percent=Absent.LOST,
                     processes_unknown=Absent.LOST, device_id=name)


def partition_key(uuid: str, parent: str, pid: int) -> str:
    """A partition's key: its own UUID, unless the library gives it the GPU's - every
    partition's UUID is the GPU's before ROCm 7.12 (ROCm/rocm-systems#3977 put the
    partition ID into it) - then the GPU's with the partition ID (its PCI device and
    partition ID, as the KFD numbers them)."""
    return uuid if uuid and uuid != parent else f"{parent}:p{pid}"


def unknown_gpu(index: int) -> GpuSample:
    """A GPU whose identity could not be read: nothing of it can be matched or used."""
    return GpuSample(index=index, uuid="", name="", pci_bus_id="", minor_number=-1,
                     state=GpuState.UNAVAILABLE, utilization_percent=Absent.UNAVAILABLE,
                     memory_util_percent=Absent.UNAVAILABLE,
                     memory_used_bytes=Absent.UNAVAILABLE,
                     memory_total_bytes=Absent.UNAVAILABLE, power_watts=Absent.UNAVAILABLE,
                     temperature_c=Absent.UNAVAILABLE, processes_unknown=Absent.UNAVAILABLE)
