"""The one interface every GPU backend implements."""

from __future__ import annotations

from typing import Protocol

from gpuscale.telemetry.model import NodeSnapshot


class GpuBackend(Protocol):
    """Reads every GPU on this node.

    ``sample`` blocks (NVML calls do) and must be called from one worker thread at a time.
    It never raises for GPU, driver or library faults: those become states and ``Absent``
    readings in the snapshot, and one log line when a fault first appears. ``seq`` in the
    returned snapshot is 0; the sampler numbers what it publishes.
    """

    name: str

    def sample(self) -> NodeSnapshot: ...

    def close(self) -> None: ...
