"""This node's ResourceSlices, kept current by a list+watch (kube.listwatch) and read into
a DraInventory (attribution/dra.py) on every change."""

from __future__ import annotations

import time
from collections.abc import Callable

from gpuscale.attribution.dra import DraInventory, PoolSlice, parse_slice
from gpuscale.kube.api import Collection, KubeApi
from gpuscale.kube.listwatch import BACKOFF_S, INACTIVITY_S

MAX_SLICES = 1_000  # a node's drivers publish a few each (128 devices a slice)
SLICES = "resource.k8s.io/v1"


class NodeSliceCache:
    """The ResourceSlices whose ``spec.nodeName`` is ``node`` (every driver's, every pool's).
    ``inventory()`` never blocks or does I/O."""

    def __init__(self, api: KubeApi, node: str,
                 monotonic: Callable[[], float] = time.monotonic,
                 inactivity_s: float = INACTIVITY_S,
                 backoff_s: tuple[float, ...] = BACKOFF_S) -> None:
        self._inventory = DraInventory()
        self._lw = api.list_watch(Collection(SLICES, "resourceslices",
                                             field_selector=f"spec.nodeName={node}"),
                                  f"ResourceSlice watch on node {node}",
                                  on_change=self._rebuild, monotonic=monotonic,
                                  inactivity_s=inactivity_s, backoff_s=backoff_s,
                                  max_items=MAX_SLICES, keep=parse_slice)

    def inventory(self) -> DraInventory | None:
        """The devices as last known, or None before the first successful list."""
        return None if self._lw.synced_at is None else self._inventory

    def state(self) -> tuple[bool, str]:
        return self._lw.state()

    async def run(self, ready: Callable[[], None] | None = None) -> None:
        await self._lw.run(ready)

    async def _rebuild(self) -> None:
        slices: list[PoolSlice] = list(self._lw.items.values())
        self._inventory = DraInventory.build(slices)
