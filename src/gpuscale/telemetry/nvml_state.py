"""What the NVML backend keeps of each GPU across ticks: its handle, static facts and
cursors, and those of its MIG instances.

Plain state owned by the sampler's worker thread (one tick at a time); the readers in
nvml_device, nvml_processes and nvml_mig update it as they go.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuscale.telemetry.model import Reading, SharingMode

UINT_MAX = 0xFFFFFFFF  # NVML's "all" / "none" in unsigned fields (link scope, instance ids)


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


def text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)
