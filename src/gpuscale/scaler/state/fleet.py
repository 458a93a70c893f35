"""The fleet view: every GPU pod's signals, in memory, as the agents last reported them.

Agents (in this process, or over their stream) call ``update_node`` once per tick with the
node's pod records. Readers never wait and never do I/O: ``select`` answers from a cache
that is rebuilt only when the namespace's pods or their labels change, so a GetMetrics
costs O(pods of the workload). A pod that moves between nodes is owned by the last node
that reported it. ``wait_changed`` lets push streams react to new
data instead of polling.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, MutableSequence, Sequence
from dataclasses import dataclass, field

from gpuscale.common.freshness import bound_of, staleness_bound
from gpuscale.scaler.core.selector import Selector
from gpuscale.stream.records import DeviceRecord, PodRecord


@dataclass
class _Node:
    pods: dict[tuple[str, str], PodRecord] = field(default_factory=dict)
    updated_at: float = 0.0
    devices: Sequence[DeviceRecord] = ()
    stale_after: float = 0.0  # the agent's own staleness bound (0: the view's default)


CACHE_ENTRIES = 20_000  # distinct (namespace, selector) pairs remembered
CACHE_BYTES = 16 * 1024 * 1024  # of selector text held in those keys


class FleetView:
    def __init__(self, stale_after: float = staleness_bound(1.0),  # an agent's default tick
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.stale_after = stale_after
        self._monotonic = monotonic
        self._nodes: dict[str, _Node] = {}
        self._pods: dict[tuple[str, str], PodRecord] = {}
        # each pod's key, one object for its life: a key made anew per update would be
        # one more young object per pod a second for the cyclic collector to walk
        self._keys: dict[tuple[str, str], tuple[str, str]] = {}
        self._ns_keys: dict[str, set[tuple[str, str]]] = {}
        self._ns_membership: dict[str, int] = {}  # bumps when a namespace's pods change
        self._select_cache: dict[tuple[str, str], tuple[int, tuple[tuple[str, str], ...]]] = {}
        self._cache_bytes = 0  # selector text held as cache keys
        self._changed = asyncio.Event()
        self.generation = 0  # bumped by every change (push loops compare it)

    # -- writers -------------------------------------------------------------------------

    def update_node(self, source: str, records: Iterable[PodRecord],
                    devices: Sequence[DeviceRecord] | None = None,
                    stale_after: float = 0.0) -> None:
        """Replace the pods (and devices, kept for the operator tools) that ``source``
        reported: the address of the agent's stream, or the node's name for an agent in
        this process (stream.records.NodeSink); ``stale_after``: that agent's staleness
        bound, from its own interval (0: the view's default). O(pods on the node);
        selections of a namespace are recomputed only when that namespace's pods come, go
        or change labels."""
        keys = self._keys
        new = {}
        for r in records:
            key = (r.namespace, r.name)
            new[keys.setdefault(key, key)] = r
        entry = self._nodes.setdefault(source, _Node())
        old = entry.pods
        for key in old.keys() - new.keys():
            if self._pods.get(key) is old[key]:  # not since reported by another node
                self._drop(key)
        for key, r in new.items():
            before = old.get(key)
            # A pod new to this node, relabelled, or dropped since (another node that
            # had it left): (re)enter it in its namespace's selections.
            if before is None or before.labels != r.labels or key not in self._pods:
                self._ns_keys.setdefault(key[0], set()).add(key)
                self._bump(key[0])
            self._pods[key] = r
        entry.pods = new
        if devices is not None:  # None: this update carried no device news
            # kept as given unless the caller could change it (a decoder's WireDevices
            # stays undecoded until someone reads it)
            entry.devices = (devices if isinstance(devices, Sequence)
                             and not isinstance(devices, MutableSequence) else tuple(devices))
        entry.updated_at = self._monotonic()
        entry.stale_after = stale_after
        self._notify()

    def remove_node(self, source: str) -> None:
        """Forget what ``source`` reported (an agent link that was dropped)."""
        entry = self._nodes.pop(source, None)
        if entry is not None:
            for key, record in entry.pods.items():
                if self._pods.get(key) is record:
                    self._drop(key)
            self._notify()

    def _drop(self, key: tuple[str, str]) -> None:
        self._pods.pop(key, None)
        self._keys.pop(key, None)
        keys = self._ns_keys.get(key[0])
        if keys is not None:
            keys.discard(key)
        self._bump(key[0])

    def _bump(self, namespace: str) -> None:
        self._ns_membership[namespace] = self._ns_membership.get(namespace, 0) + 1

    def _notify(self) -> None:
        self.generation += 1
        self._changed.set()
        self._changed = asyncio.Event()

    # -- readers -------------------------------------------------------------------------

    def select(self, namespace: str, selector: Selector) -> list[PodRecord]:
        """Pods of ``namespace`` whose labels match, with their latest records."""
        key = (namespace, selector.text)
        membership = self._ns_membership.get(namespace, 0)
        hit = self._select_cache.get(key)
        if hit is None or hit[0] != membership:
            names = tuple(sorted(k for k in self._ns_keys.get(namespace, ())
                                 if selector.matches(self._pods[k].labels)))
            if len(self._select_cache) >= CACHE_ENTRIES or self._cache_bytes > CACHE_BYTES:
                self._select_cache.clear()
                self._cache_bytes = 0
            if key not in self._select_cache:
                self._cache_bytes += len(key[0]) + len(key[1])
            hit = self._select_cache[key] = (membership, names)
        pods = self._pods
        return [pods[k] for k in hit[1] if k in pods]

    def now(self) -> float:
        """The view's clock (records' ``sampled_at`` are on it)."""
        return self._monotonic()

    def age(self, record: PodRecord) -> float:
        return self._monotonic() - record.sampled_at

    def nodes(self) -> dict[str, float]:
        """Source (the stream address, or the node an in-process agent named) -> seconds
        since its last update."""
        now = self._monotonic()
        return {n: now - e.updated_at for n, e in self._nodes.items()}

    def bounds(self) -> dict[str, float]:
        """Source (as in ``nodes``) -> its staleness bound: its agent's own, else the
        view's default (common.freshness)."""
        return {n: bound_of(e.stale_after, self.stale_after) for n, e in self._nodes.items()}

    def devices(self) -> dict[str, Sequence[DeviceRecord]]:
        """Source (as in ``nodes``) -> its devices as last reported."""
        return {n: e.devices for n, e in self._nodes.items()}

    def pods(self) -> list[PodRecord]:
        """Every pod's latest record."""
        return list(self._pods.values())

    def pod(self, namespace: str, name: str) -> PodRecord | None:
        """One pod's latest record (None: no node reports it)."""
        return self._pods.get((namespace, name))

    def pod_count(self) -> int:
        return len(self._pods)

    async def wait_changed(self, within: float) -> bool:
        """Wait for the next update (True), or ``within`` seconds to pass (False)."""
        event = self._changed
        try:
            await asyncio.wait_for(event.wait(), within)
        except TimeoutError:
            return False
        return True
