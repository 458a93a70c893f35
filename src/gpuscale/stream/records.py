"""The records that cross the agent -> scaler boundary, and what consumes them.

An agent turns each tick into one ``PodRecord`` per pod that holds GPUs (agent.records),
hands the node's list to every ``NodeSink`` it was given (its telemetry stream, or a fleet
view in the same process), and the scaler's subscriber hands the decoded list to its own
sink. Both ends import these types from here, below both of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gpuscale.attribution.model import OwnerRef
from gpuscale.telemetry.model import Absent, Reading


@dataclass(frozen=True, slots=True)
class PodRecord:
    """One pod's signals at one agent tick. ``sampled_at`` is on the receiver's monotonic
    clock (the subscriber stamps its receipt time, so agents' clock skew does not matter)."""

    namespace: str
    name: str
    node: str
    labels: Mapping[str, str]
    owner: OwnerRef | None
    ready: bool
    signals: Mapping[str, Reading]
    sampled_at: float
    stale_after: float = 0.0  # this pod's staleness bound; 0: the receiver's default
    reasons: Mapping[str, str] = field(default_factory=dict)  # signal -> why it is Absent


@dataclass(frozen=True, slots=True)
class DeviceRecord:
    """One GPU or MIG instance of a node at one tick, and the pods allocated it (for the
    operator tools; the scaler's answers come from the pods' signals)."""

    uuid: str
    index: int  # the GPU's index on the node (a MIG instance: its parent's)
    model: str  # the GPU's name; a MIG instance: its profile ("1g.10gb")
    parent_uuid: str = ""  # a MIG instance's GPU
    sharing: str = "exclusive"  # exclusive, time-sliced, mps, mig (a GPU split into MIG)
    utilization: Reading = Absent.NO_DATA  # percent
    memory_used_mib: Reading = Absent.NO_DATA
    memory_total_mib: Reading = Absent.NO_DATA
    pods: tuple[str, ...] = ()  # "namespace/name" of each pod allocated it


class NodeSink(Protocol):
    """Takes a node's whole state per tick (full updates: skipping one loses nothing)."""

    def update_node(self, node: str, records: Iterable[PodRecord],
                    devices: Sequence[DeviceRecord] | None = None) -> None:
        """Replace ``node``'s pods with ``records`` (and its devices with ``devices``;
        None: keep the last ones)."""
        ...

    def remove_node(self, node: str) -> None:
        """Forget ``node`` and its pods."""
        ...
