"""Immutable GPU readings: the values every layer above telemetry consumes.

Importable without NVML, gRPC or any I/O library. A reading that could not be taken is an
``Absent`` member, never ``None`` by accident and never 0: "unsupported" (this device or
driver cannot give it), "unavailable" (a call failed this time), "lost" (the GPU fell off
the bus) and "no data" (no fresh sample in the window) stay distinct all the way up, and so does
"shared" (a time-sliced GPU's load that cannot be split between the pods sharing it).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Absent(enum.Enum):
    """Why a reading has no number."""

    UNSUPPORTED = "unsupported"
    UNAVAILABLE = "unavailable"
    LOST = "lost"
    NO_DATA = "no_data"
    SHARED = "shared"  # a shared GPU's load with no per-process data to split it by pod

    def __repr__(self) -> str:
        return f"Absent.{self.name}"


#: A reading: a number, or the reason there is none.
Reading = float | Absent
IntReading = int | Absent


class GpuState(enum.Enum):
    """Health of one physical GPU as the backend saw it at sample time."""

    OK = "ok"
    LOST = "lost"  # NVML_ERROR_GPU_IS_LOST: readings are Absent.LOST until the driver recovers
    UNAVAILABLE = "unavailable"  # the handle could not be obtained this tick


class BackendState(enum.Enum):
    """Whether the backend could talk to the GPUs at all."""

    OK = "ok"
    UNAVAILABLE = "unavailable"  # library missing, driver not loaded, version mismatch...


class SharingMode(enum.Enum):
    """How the device plugin hands this GPU to pods (from configuration or scenario)."""

    EXCLUSIVE = "exclusive"
    TIME_SLICED = "time-sliced"
    MPS = "mps"
    MIG = "mig"


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """One process with a context on a GPU or MIG instance.

    ``used_memory_bytes`` is Absent when the driver hides it. ``sm_util_percent`` is the
    process's mean SM activity over the sample window (0-100); 0.0 for a process the driver
    lists as running but gave no entry (it has one only for a process that did work);
    ``Absent.NO_DATA`` for a process new since the last window when no driver sample ended
    in this one; ``UNAVAILABLE`` (the call failed) or ``UNSUPPORTED`` (MIG, or a driver
    without it) when per-process utilization could not be read - never 0 then.
    ``mps_client``: the process reaches the GPU through an MPS server (listed by the MPS
    compute listing); the server itself is listed as an ordinary compute process.
    ``Absent.SHARED`` for an MPS client without a sample of its own while another process
    on the device (its MPS server) has one: its work may be booked there.
    """

    pid: int
    used_memory_bytes: IntReading
    sm_util_percent: Reading = Absent.NO_DATA
    mem_util_percent: Reading = Absent.NO_DATA
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    mps_client: bool = False


@dataclass(frozen=True, slots=True)
class MigSample:
    """One MIG compute instance, or one partition of a partitioned AMD GPU.

    Utilization comes from GPM (graphics-engine activity, 0-100) where the hardware has it,
    otherwise ``Absent.UNSUPPORTED`` - the driver gives no device utilization on MIG. An AMD
    partition's is the mean busy share of the XCCs it holds (never the whole GPU's
    activity); ``gpu_instance_id`` is its partition ID, ``profile`` its modes
    (``cpx.nps1``), ``device_id`` the device plugin's name for it (a PCI address or
    ``amdgpu_xcp_<n>``; "" when it could not be read, and then no pod can be matched to it).
    """

    uuid: str
    parent_uuid: str
    index: int  # position among the parent's MIG devices
    gpu_instance_id: int
    compute_instance_id: int
    profile: str  # e.g. "3g.40gb"
    memory_used_bytes: IntReading
    memory_total_bytes: IntReading
    utilization_percent: Reading
    processes: tuple[ProcessSample, ...] = ()
    #: Why ``processes`` is not the instance's full list (its listing failed, is unsupported,
    #: or the GPU is lost); None when it is.
    processes_unknown: Absent | None = None
    device_id: str = ""
    #: Why the memory readings are Absent, in words a person can act on ("" when the
    #: Absent says enough): carried to the pods' memory signals as their reason.
    memory_reason: str = ""


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One physical GPU at one sample time.

    Units: utilization in percent (0-100) averaged over the sample window, memory in bytes,
    power in watts, temperature in degrees C, clocks in MHz, energy in millijoules since the
    driver loaded, throughputs in bytes per second.

    ``processes`` are all the processes with a context on the GPU (on MIG: on its instances)
    when ``processes_unknown`` is None; otherwise it says why the list is incomplete, and an
    absent process must not be read as an idle one.
    """

    index: int
    uuid: str
    name: str
    pci_bus_id: str
    minor_number: int
    state: GpuState = GpuState.OK
    utilization_percent: Reading = Absent.NO_DATA
    utilization_samples: int = 0  # driver samples averaged into utilization_percent
    memory_util_percent: Reading = Absent.NO_DATA
    memory_used_bytes: IntReading = Absent.NO_DATA
    memory_free_bytes: IntReading = Absent.NO_DATA
    memory_total_bytes: IntReading = Absent.NO_DATA
    memory_reserved_bytes: IntReading = Absent.NO_DATA
    power_watts: Reading = Absent.NO_DATA
    power_limit_watts: Reading = Absent.NO_DATA
    temperature_c: Reading = Absent.NO_DATA
    sm_clock_mhz: Reading = Absent.NO_DATA
    energy_millijoules: IntReading = Absent.NO_DATA
    nvlink_tx_bytes_per_second: Reading = Absent.UNSUPPORTED
    nvlink_rx_bytes_per_second: Reading = Absent.UNSUPPORTED
    pcie_tx_bytes_per_second: Reading = Absent.UNSUPPORTED
    pcie_rx_bytes_per_second: Reading = Absent.UNSUPPORTED
    xid_errors_total: int = 0  # XID events seen since the agent started
    last_xid: int = 0  # code of the last XID event; 0 = none seen (dcgm-exporter's meaning)
    mig_enabled: bool = False
    sharing: SharingMode = SharingMode.EXCLUSIVE
    migs: tuple[MigSample, ...] = ()
    processes: tuple[ProcessSample, ...] = ()
    processes_unknown: Absent | None = None
    memory_reason: str = ""  # as MigSample's: why the memory readings are Absent


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    """Everything one backend read on one node in one tick.

    ``taken_at`` is wall-clock seconds since the epoch; ``monotonic`` is the sampler's
    monotonic clock at the same instant (freshness checks use it). ``seq`` increases by one
    per published snapshot of the same agent process.
    """

    node: str
    backend: str
    taken_at: float
    monotonic: float
    seq: int = 0
    state: BackendState = BackendState.OK
    reason: str = ""  # why the backend is not OK
    driver_version: str = ""
    gpus: tuple[GpuSample, ...] = ()
    duration_seconds: float = 0.0  # how long the sample took
    problems: tuple[str, ...] = ()  # "gpu 3: power: unavailable (...)", this tick only
