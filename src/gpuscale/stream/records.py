"""The records that cross the agent -> scaler boundary, and what consumes them.

An agent turns each tick into one ``NodeReport`` (agent.report.tick): one ``PodRecord`` per
pod that holds GPUs and the node's ``DeviceRecord``s, or why its pods are not yet known.
The report goes to its telemetry stream (stream.publisher, encoded by stream.codec) and to
any ``NodeSink`` in the same process (a fleet view: the demo); the scaler's subscriber
decodes each update back into a report for its own sink. Both kinds of sink get reports
the same way, through ``deliver``: an incomplete report changes nothing. Both ends import
these types from here, below both of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gpuscale.attribution.model import OwnerRef
from gpuscale.common.errors import Unavailable
from gpuscale.common.freshness import staleness_bound
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
    # beside pods, one each: the DRA claim "namespace/name" that pod holds it through
    # ("" for a device-plugin allocation); () when none is known (an older agent)
    claims: tuple[str, ...] = ()

    def holders(self) -> list[str]:
        """Each pod allocated it, for a person: "namespace/name", and " (claim <name>)"
        when it holds the device through a DRA claim."""
        return held_by(self.pods, self.claims)


def held_by(pods: Sequence[str], claims: Sequence[str]) -> list[str]:
    """``pods`` ("namespace/name") with their claims (beside them, one each, or none):
    a claim lives in its pod's namespace, so only its name is shown."""
    if len(claims) != len(pods):
        claims = [""] * len(pods)
    return [p + (f" (claim {c.partition('/')[2] or c})" if c else "")
            for p, c in zip(pods, claims, strict=True)]


@dataclass(frozen=True, slots=True)
class NodeReport:
    """What one agent tick produced for one node.

    ``pods``: one record per pod that holds GPUs (a complete report; an empty tuple is a
    node with no GPU pods), or ``Unavailable`` with why they are not known (incomplete:
    the GPU backend or attribution is unavailable, or a pod holding GPUs has no metadata
    - labels, readiness, owner - yet). Published as they are, such pods would match no
    workload and drop out of its sum; a consumer keeps the last complete pods instead,
    which age past the staleness bound (their workloads then answer UNAVAILABLE) - never
    an empty or smaller view.
    ``devices``: the node's GPUs and MIG instances and who holds them, or None when this
    report carries no device news (the last ones stand); an incomplete report carries
    none. ``seq`` increases by one per tick of the same agent process. ``sampled_at`` is
    on the clock of whoever holds the report, like its pods': the agent's monotonic clock
    at the sample, or a subscriber's at receipt. ``interval``: the agent's tick, seconds.
    """

    node: str
    seq: int
    sampled_at: float
    interval: float
    pods: tuple[PodRecord, ...] | Unavailable
    devices: Sequence[DeviceRecord] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.pods, Unavailable) and not self.pods.reason:
            raise ValueError("a report whose pods are not known says why")
        if isinstance(self.pods, Unavailable) and self.devices is not None:
            raise ValueError("a report whose pods are not known carries no devices")

    @property
    def complete(self) -> bool:
        return not isinstance(self.pods, Unavailable)

    @property
    def reason(self) -> str:
        """Why the pods are not known ("" when the report is complete)."""
        return self.pods.reason if isinstance(self.pods, Unavailable) else ""


class NodeSink(Protocol):
    """Takes a node's whole state per tick (full updates: skipping one loses nothing),
    keyed by its source: the address of the stream that reported it, or the node's name
    when the agent runs in the same process."""

    def update_node(self, source: str, records: Iterable[PodRecord],
                    devices: Sequence[DeviceRecord] | None = None,
                    stale_after: float = 0.0) -> None:
        """Replace what ``source`` reported with ``records`` (and its devices with
        ``devices``; None: keep the last ones). ``stale_after``: the reporting agent's
        staleness bound, from its interval (common.freshness; 0: the sink's default)."""
        ...

    def remove_node(self, source: str) -> None:
        """Forget ``source`` and its pods."""
        ...


def deliver(report: NodeReport, sink: NodeSink, source: str) -> bool:
    """Hand a complete ``report`` to ``sink`` as ``source``'s update; True when handed. An
    incomplete one hands nothing: the sink keeps ``source``'s last complete pods, which
    age (see ``NodeReport``)."""
    if isinstance(report.pods, Unavailable):
        return False
    sink.update_node(source, report.pods, report.devices,
                     stale_after=staleness_bound(report.interval))
    return True
