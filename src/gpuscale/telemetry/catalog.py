"""GPU models the simulator knows, with the figures the real parts report.

Memory is what ``nvidia-smi`` shows as the total (MiB), power is the default enforced limit,
clocks are the max SM clock and the idle clock. MIG profiles list the instance memory the
driver reports for each profile (rounded to MiB) and the GPU-instance slice count; a GPU has
7 compute slices. ``gpm`` says whether the part has GPU Performance Monitoring (Hopper and
newer), which is the only source of per-MIG-instance utilization.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class MigProfile:
    name: str  # "3g.40gb"
    slices: int  # GPU-instance slices (the "3g")
    memory_mib: int


@dataclass(frozen=True, slots=True)
class GpuModel:
    key: str
    name: str  # as NVML's nvmlDeviceGetName reports it
    memory_mib: int
    power_limit_watts: float
    idle_power_watts: float
    max_sm_clock_mhz: int
    idle_sm_clock_mhz: int
    gpm: bool
    mig_profiles: tuple[MigProfile, ...] = ()

    def profile(self, name: str) -> MigProfile | None:
        return next((p for p in self.mig_profiles if p.name == name), None)


MIG_SLICES = 7

_H100_MIG = (
    MigProfile("1g.10gb", 1, 9984),
    MigProfile("1g.20gb", 1, 19968),
    MigProfile("2g.20gb", 2, 19968),
    MigProfile("3g.40gb", 3, 40192),
    MigProfile("4g.40gb", 4, 40192),
    MigProfile("7g.80gb", 7, 80384),
)
_A100_80_MIG = (
    MigProfile("1g.10gb", 1, 9728),
    MigProfile("1g.20gb", 1, 19968),
    MigProfile("2g.20gb", 2, 19968),
    MigProfile("3g.40gb", 3, 40192),
    MigProfile("4g.40gb", 4, 40192),
    MigProfile("7g.80gb", 7, 80384),
)
_A100_40_MIG = (
    MigProfile("1g.5gb", 1, 4864),
    MigProfile("1g.10gb", 1, 9984),
    MigProfile("2g.10gb", 2, 9984),
    MigProfile("3g.20gb", 3, 19968),
    MigProfile("4g.20gb", 4, 19968),
    MigProfile("7g.40gb", 7, 40192),
)

CATALOG: dict[str, GpuModel] = {
    m.key: m
    for m in (
        GpuModel("H100-SXM5-80GB", "NVIDIA H100 80GB HBM3", 81559, 700.0, 70.0, 1980, 345,
                 True, _H100_MIG),
        GpuModel("H200-SXM-141GB", "NVIDIA H200", 143771, 700.0, 75.0, 1980, 345, True, ()),
        GpuModel("A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", 81920, 400.0, 55.0, 1410, 210,
                 False, _A100_80_MIG),
        GpuModel("A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB", 40960, 400.0, 50.0, 1410, 210,
                 False, _A100_40_MIG),
        GpuModel("L40S", "NVIDIA L40S", 46068, 350.0, 35.0, 2520, 210, False, ()),
        GpuModel("L4", "NVIDIA L4", 23034, 72.0, 16.0, 2040, 210, False, ()),
        GpuModel("A10G", "NVIDIA A10G", 23028, 300.0, 25.0, 1710, 210, False, ()),
        GpuModel("T4", "Tesla T4", 15360, 70.0, 10.0, 1590, 300, False, ()),
        # AMD's MI300X datasheet: 192 GB HBM3 (as amd-smi's MiB), 750 W board power, peak
        # engine clock 2100 MHz. Its name as amdsmi's market_name gives it.
        GpuModel("MI300X", "AMD Instinct MI300X", 196608, 750.0, 140.0, 2100, 300, False, ()),
    )
}
