"""Which VRAM a partition's handle reports, and what of it can be trusted (pure).

A partitioned AMD GPU (compute mode DPX/TPX/QPX/CPX, memory mode NPS1/NPS2/NPS4) is one
processor per partition to the library, and each answers ``amdsmi_get_gpu_memory_total`` and
``amdsmi_get_gpu_memory_usage`` for VRAM. What those numbers are depends on the ROCm stack:

- ``OWN``: each partition's own share (the totals add up to the GPU's memory). Read as is.
- ``WHOLE_GPU``: every partition reports the whole GPU's pool, total and used - rocm_smi and
  amd-smi on ROCm 6.3.3 (ROCm issue 4750, MI300X in CPX with NPS1 or NPS4). A pod filling its
  CPX partition would read 12.2 % (its 24 GB over the pool's 192 GB) instead of 97.7 %.
- ``MEMORY_POOL``: every partition reports its memory partition's pool (NPS4: a quarter of
  the GPU, shared by the partitions on it).

Later stacks split it differently again: the total from sysfs split evenly, or from the
KFD's per-partition allocation (ROCm/rocm-systems#8419, which leaves reserved memory out, so
the totals add up to a little less than the GPU). A partition's own use cannot be taken
from a pool's counter, and its processes' VRAM never adds up to it (the process list is
never complete), so under ``WHOLE_GPU`` and ``MEMORY_POOL`` a partition's memory is
UNAVAILABLE with the reason (the version skew, what to do) - never the pool's small share.
Which style a GPU's readings are is told from the product's memory: totals that add up to
it are ``OWN``; identical totals equal to it (or to a memory partition of it) are a pool.
A product not listed here cannot be told apart: its partitions' memory is UNAVAILABLE.

VRAM used of exactly 0. rocm_smi answers success with used = 0 when its read of the used
counter fails while the total succeeds. A booted GPU is never at 0: the kernel's own
allocations are in the counter (a ROCm maintainer in ROCm issue 1909). So a whole GPU's 0 is
UNAVAILABLE; a partition's own 0 is kept only when no process is listed on it and it is not
busy (its processes, or its engine, say it holds memory).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from gpuscale.telemetry.model import Absent, IntReading

MIB = 1024 * 1024

#: The VRAM of each product whose partitions can be told apart, in MiB (AMD's datasheets:
#: MI300X/MI308X 192 GB HBM3, MI325X 256 GB HBM3E, MI350X/MI355X 288 GB HBM3E), by the
#: model in the market name the library gives ("AMD Instinct MI300X OAM").
PRODUCT_VRAM_MIB = {"MI300X": 196608, "MI308X": 196608, "MI325X": 262144,
                    "MI350X": 294912, "MI355X": 294912}
#: A pool's total is within this share of the product's (the library's MI300X total is
#: 196592 MiB, a little under the datasheet's 192 GiB)...
POOL_TOLERANCE = 0.05
#: ...and the partitions' own totals add up to between this share and 100 % of it (the
#: KFD's allocation leaves reserved memory out).
OWN_LOW = 0.85


class VramStyle(enum.Enum):
    OWN = "own"
    WHOLE_GPU = "whole-gpu"
    MEMORY_POOL = "memory-pool"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class PartitionVram:
    """What a partitioned GPU's VRAM readings are: each partition's (used, total) as the
    pods get them, the physical GPU's (used, total), and why any is not a number."""

    style: VramStyle
    partitions: tuple[tuple[IntReading, IntReading], ...]
    gpu_used: IntReading
    gpu_total: IntReading
    reason: str = ""


def product_vram(name: str) -> int | None:
    """The product's VRAM in bytes from its market name, or None when not listed."""
    for model in re.findall(r"MI\d{3}[A-Z]?", name.upper()):
        if model in PRODUCT_VRAM_MIB:
            return PRODUCT_VRAM_MIB[model] * MIB
    return None


def memory_partitions(mode: str) -> int:
    """How many memory partitions a memory mode makes (NPS4 -> 4); 1 when not said."""
    m = re.fullmatch(r"NPS(\d)", mode.strip().upper())
    return int(m.group(1)) if m and int(m.group(1)) > 0 else 1


def classify(name: str, memory_mode: str,
             reads: list[tuple[IntReading, IntReading]]) -> tuple[VramStyle, int | None]:
    """The reporting style of a partitioned GPU's (used, total) per partition, and the
    product's VRAM (bytes) it was told by. A missing reading is no evidence: the style is
    told from the totals that were read."""
    totals = [t for _, t in reads if not isinstance(t, Absent)]
    device = product_vram(name)
    if device is None or not totals or len(reads) < 2:
        return VramStyle.UNKNOWN, device
    nps = memory_partitions(memory_mode)
    same = max(totals) - min(totals) <= device * 0.001
    if same and abs(totals[0] - device) <= device * POOL_TOLERANCE:
        return VramStyle.WHOLE_GPU, device
    pool = device / nps
    if same and nps > 1 and len(reads) > nps and abs(totals[0] - pool) <= pool * POOL_TOLERANCE:
        return VramStyle.MEMORY_POOL, device
    # the totals read are each a share: n of them add up to the GPU (a partition whose
    # total is missing - lost, failed - keeps its own Absent)
    if OWN_LOW * device <= sum(totals) / len(totals) * len(reads) <= device * 1.001:
        return VramStyle.OWN, device
    return VramStyle.UNKNOWN, device


def partition_vram(name: str, memory_mode: str, reads: list[tuple[IntReading, IntReading]],
                   rocm: str) -> PartitionVram:
    """Each partition's VRAM as its pods get it, and the GPU's (see the module's text).
    ``rocm``: the node's ROCm version, for the reason ("" when not known)."""
    style, device = classify(name, memory_mode, reads)
    n = len(reads)
    if style is VramStyle.OWN:
        return PartitionVram(style, tuple(reads), _sum([u for u, _ in reads]),
                             _sum([t for _, t in reads]))
    stack = f"ROCm {rocm}" if rocm else "this node's ROCm"
    unavailable = tuple((Absent.UNAVAILABLE, Absent.UNAVAILABLE) for _ in reads)
    if style is VramStyle.UNKNOWN:
        why = (f"VRAM of {n} partitions of {name or 'this GPU'} unavailable: "
               + ("gpuscale does not know this product's memory, so it cannot tell whether "
                  "the library reports each partition's own VRAM or the whole GPU's"
                  if device is None else
                  f"their totals ({_mib_list(reads)} MiB) fit no known reporting "
                  f"style of {stack}")
               + "; run the GPU in SPX mode, or report this")
        return PartitionVram(style, unavailable, Absent.UNAVAILABLE, Absent.UNAVAILABLE, why)
    whole = style is VramStyle.WHOLE_GPU
    pool = "the whole GPU's" if whole else f"its {memory_mode.upper()} memory partition's"
    why = (f"every partition reports {pool} VRAM, not its own ({stack}'s libamd_smi; "
           f"ROCm issue 4750): upgrade ROCm and the agent image, or use SPX mode")
    totals = [t for _, t in reads if not isinstance(t, Absent)]
    if whole:  # one pool read on every handle: the largest used is never too small
        used = max((u for u, _ in reads if not isinstance(u, Absent)), default=None)
        return PartitionVram(style, unavailable,
                             used if used is not None and len(totals) == n
                             else Absent.UNAVAILABLE, totals[0], why)
    return PartitionVram(style, unavailable, Absent.UNAVAILABLE,
                         totals[0] * memory_partitions(memory_mode), why)


def trusted_used(used: IntReading, *, partition: bool, processes: int,
                 busy: float | Absent) -> tuple[IntReading, str]:
    """A VRAM used reading after the zero rule (see the module's text): the reading, or
    UNAVAILABLE with why."""
    if isinstance(used, Absent) or used != 0:
        return used, ""
    if not partition:
        return Absent.UNAVAILABLE, ("VRAM used reads 0, which a booted GPU never is (the "
                                    "library answers 0 when its read fails)")
    if processes:
        return Absent.UNAVAILABLE, (f"VRAM used reads 0 while {processes} process(es) "
                                    f"hold memory on it (the library answers 0 when its "
                                    f"read fails)")
    if not isinstance(busy, Absent) and busy > 0:
        return Absent.UNAVAILABLE, (f"VRAM used reads 0 while it is {busy:.0f} % busy (the "
                                    f"library answers 0 when its read fails)")
    return used, ""


def _sum(values: list[IntReading]) -> IntReading:
    missing = next((v for v in values if isinstance(v, Absent)), None)
    return missing if missing is not None else sum(v for v in values
                                                   if not isinstance(v, Absent))


def _mib_list(reads: list[tuple[IntReading, IntReading]]) -> str:
    return ", ".join("?" if isinstance(t, Absent) else str(t // MIB) for _, t in reads[:8])
