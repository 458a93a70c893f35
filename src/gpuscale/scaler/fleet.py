"""The fleet view: every GPU pod's signals, in memory, as the agents last reported them.

Agents (in this process, or over their stream) call ``update_node`` once per tick with the
node's pod records. Readers never wait and never do I/O: ``select`` answers from a cache
that is rebuilt only when pods or their labels change (``membership`` generation), so a
GetMetrics costs O(pods of the workload). ``wait_changed`` lets push streams react to new
data instead of polling.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from gpuscale.attribution.model import NodeAttribution, OwnerRef, PodUsage
from gpuscale.scaler.selector import Selector
from gpuscale.telemetry.model import Absent, NodeSnapshot, Reading


@dataclass(frozen=True, slots=True)
class PodRecord:
    """One pod's signals at one agent tick. ``sampled_at`` is on the fleet's monotonic clock."""

    namespace: str
    name: str
    node: str
    labels: Mapping[str, str]
    owner: OwnerRef | None
    ready: bool
    signals: Mapping[str, Reading]
    sampled_at: float


@dataclass
class _Node:
    pods: dict[tuple[str, str], PodRecord] = field(default_factory=dict)
    updated_at: float = 0.0


class FleetView:
    def __init__(self, stale_after: float = 3.0,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.stale_after = stale_after
        self._monotonic = monotonic
        self._nodes: dict[str, _Node] = {}
        self._by_ns: dict[str, list[PodRecord]] = {}
        self.membership = 0  # bumps when pods come, go or change labels
        self.version = 0  # bumps on every update
        self._select_cache: dict[tuple[str, str], tuple[int, tuple[tuple[str, str], ...]]] = {}
        self._changed = asyncio.Event()

    # -- writers -------------------------------------------------------------------------

    def update_node(self, node: str, records: Iterable[PodRecord]) -> None:
        new = {(r.namespace, r.name): r for r in records}
        entry = self._nodes.setdefault(node, _Node())
        old = entry.pods
        if old.keys() != new.keys() or any(old[k].labels != new[k].labels for k in new):
            self.membership += 1
        entry.pods = new
        entry.updated_at = self._monotonic()
        self._reindex()
        self.version += 1
        self._changed.set()
        self._changed = asyncio.Event()

    def remove_node(self, node: str) -> None:
        if self._nodes.pop(node, None) is not None:
            self.membership += 1
            self._reindex()
            self.version += 1
            self._changed.set()
            self._changed = asyncio.Event()

    def _reindex(self) -> None:
        by_ns: dict[str, list[PodRecord]] = {}
        for n in self._nodes.values():
            for r in n.pods.values():
                by_ns.setdefault(r.namespace, []).append(r)
        self._by_ns = by_ns

    # -- readers -------------------------------------------------------------------------

    def select(self, namespace: str, selector: Selector) -> list[PodRecord]:
        """Pods of ``namespace`` whose labels match, with their latest records."""
        key = (namespace, selector.text)
        hit = self._select_cache.get(key)
        if hit is None or hit[0] != self.membership:
            names = tuple((r.namespace, r.name) for r in self._by_ns.get(namespace, ())
                          if selector.matches(r.labels))
            if len(self._select_cache) > 10_000:
                self._select_cache.clear()
            self._select_cache[key] = (self.membership, names)
            hit = self._select_cache[key]
        pods = {(r.namespace, r.name): r for r in self._by_ns.get(namespace, ())}
        return [pods[k] for k in hit[1] if k in pods]

    def age(self, record: PodRecord) -> float:
        return self._monotonic() - record.sampled_at

    def nodes(self) -> dict[str, float]:
        """Node -> seconds since its last update."""
        now = self._monotonic()
        return {n: now - e.updated_at for n, e in self._nodes.items()}

    def pod_count(self) -> int:
        return sum(len(n.pods) for n in self._nodes.values())

    async def wait_changed(self, within: float) -> bool:
        """Wait for the next update (True), or ``within`` seconds to pass (False)."""
        event = self._changed
        try:
            await asyncio.wait_for(event.wait(), within)
        except TimeoutError:
            return False
        return True


def pod_records(snapshot: NodeSnapshot, attribution: NodeAttribution,
                sampled_at: float,
                engines: Mapping[tuple[str, str], Mapping[str, Reading]] | None = None,
                ) -> list[PodRecord]:
    """One record per pod that holds GPUs: its GPU signals (and engine signals, if any).

    gpu-utilization is the mean over the pod's devices (containers together), 0-100;
    gpu-memory is used over total of those devices. An Absent device reading makes the
    pod's signal that Absent, never a partial mean.
    """
    by_pod: dict[tuple[str, str], list[PodUsage]] = {}
    for u in attribution.pods:
        by_pod.setdefault((u.namespace, u.pod), []).append(u)
    out = []
    for (ns, name), usages in by_pod.items():
        devices = [d for u in usages for d in u.devices]
        utils = [d.utilization_percent for d in devices]
        used = [d.memory_used_bytes for d in devices]
        total = [d.memory_total_bytes for d in devices]
        signals: dict[str, Reading] = {
            "gpu-utilization": _mean(utils) if devices else Absent.NO_DATA,
            "gpu-memory": _ratio(used, total) if devices else Absent.NO_DATA,
        }
        if engines and (ns, name) in engines:
            signals.update(engines[(ns, name)])
        info = usages[0].pod_info
        out.append(PodRecord(ns, name, snapshot.node,
                             dict(info.labels) if info else {},
                             info.owner if info else None,
                             info.ready if info else False, signals, sampled_at))
    return out


def _first_absent(values: list[Reading] | list[int | Absent]) -> Absent | None:
    return next((v for v in values if isinstance(v, Absent)), None)


def _mean(values: list[Reading]) -> Reading:
    bad = _first_absent(values)
    if bad is not None:
        return bad
    nums = [float(v) for v in values if not isinstance(v, Absent)]
    return sum(nums) / len(nums)


def _ratio(used: list[int | Absent], total: list[int | Absent]) -> Reading:
    bad = _first_absent(used) or _first_absent(total)
    if bad is not None:
        return bad
    t = sum(v for v in total if not isinstance(v, Absent))
    u = sum(v for v in used if not isinstance(v, Absent))
    return 100.0 * u / t if t > 0 else Absent.UNAVAILABLE
