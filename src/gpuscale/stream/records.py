"""The records that cross the agent -> scaler boundary, and what consumes them.

An agent turns each tick into one ``PodRecord`` per pod that holds GPUs (agent.records),
hands the node's list to every ``NodeSink`` it was given (its telemetry stream, or a fleet
view in the same process), and the scaler's subscriber hands the decoded list to its own
sink. Both ends import these types from here, below both of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from gpuscale.attribution.model import OwnerRef
from gpuscale.telemetry.model import Reading


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


class NodeSink(Protocol):
    """Takes a node's whole state per tick (full updates: skipping one loses nothing)."""

    def update_node(self, node: str, records: Iterable[PodRecord]) -> None:
        """Replace ``node``'s pods with ``records``."""
        ...

    def remove_node(self, node: str) -> None:
        """Forget ``node`` and its pods."""
        ...
