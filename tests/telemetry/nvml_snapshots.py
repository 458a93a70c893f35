"""What the NVML backend's tests read a snapshot with, and the fake driver's clock."""

from __future__ import annotations

from typing import Any

GIB = 2**30
T0 = 1_700_000_000_000_000  # a frozen driver clock (epoch us), on every sample grid used here
PERIOD = 1_000_000  # sample_us: the driver's sample period in the per-process tests


def clock(us: int) -> str:
    """The scenario's first line: the driver's clock stands at ``us``."""
    return f"global clock_us={us}"


def gpu(snap: dict[str, Any], index: int) -> dict[str, Any]:
    return next(g for g in snap["gpus"] if g["index"] == index)


def procs_of(snap: dict[str, Any], index: int) -> dict[int, dict[str, Any]]:
    return {q["pid"]: q for q in gpu(snap, index)["processes"]}
