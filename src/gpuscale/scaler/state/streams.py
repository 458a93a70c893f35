"""KEDA's long-lived streams, bounded the way KEDA opens them.

KEDA's operator puts every ScaledObject that names one ``scalerAddress`` on one gRPC
connection (``getClientForConnectionPool`` in KEDA's ``pkg/scalers/external_scaler.go``),
so a per-connection cap is a cap on ScaledObjects: 400 streams per peer refused most of a
1,000-ScaledObject KEDA, which retried each refused stream forever. The bounds here are
those KEDA can live with:

- **One live stream of each kind per identity** (kind, namespace, name and the trigger's
  metadata): a new one replaces the old, which ends with ABORTED and says by what. KEDA
  opens one stream per push trigger, so a healthy KEDA never holds two; a second one is a
  re-open whose old half was never torn down (a half-open connection, a restarted
  operator), and keeping both would leak one per re-open.
- **A global bound by memory**: each stream costs the scaler ``STREAM_BYTES`` (gRPC's call
  objects and the stream's state, measured) plus its identity's text; past the budget a new
  identity is refused with RESOURCE_EXHAUSTED naming the budget and the flag that sets it.
  A replacement is never refused (it frees what it takes).

Two triggers of one ScaledObject with exactly the same metadata are one identity: their
streams replace each other on every re-open (both carry the same answer, so KEDA sees the
same activity; the churn is counted in ``replaced``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gpuscale.common.errors import Overloaded, Superseded

STREAM_BYTES = 30 * 1024  # one open stream, measured (BENCHMARKS.md: streams, one connection)
# With --answer-process the gRPC stream lives in the child and its state here: 20,000
# streams took 1,014 MiB in both processes against ~245 MiB without streams, ~40 KB each
# (BENCHMARKS.md: KEDA's port in a process of its own); the budget counts both shares.
RELAYED_STREAM_BYTES = 40 * 1024
MEMORY_BUDGET_MIB = 256  # default for --stream-memory-mib: ~8,700 streams (4,350 push
#                          ScaledObjects), inside the deploy's 512 MiB limit beside the
#                          ~200 MiB a scaler holds for 1,000 agents
KINDS = ("StreamIsActive", "StreamMetricSpec")

Key = tuple[str, str, str, tuple[tuple[str, str], ...]]


class TooManyStreams(Overloaded):
    """The scaler's stream budget is spent."""


@dataclass(eq=False)
class Held:
    """One live stream's place in the book. ``ended`` is set when a newer stream replaced
    it (``reason`` says by what); ``on_end`` (if set) is called with the error at once, so
    a stream waiting for its next answer wakes up."""

    key: Key
    peer: str
    size: int
    reason: Superseded | None = None
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    on_end: Callable[[Exception], None] | None = None

    def watch(self, on_end: Callable[[Exception], None]) -> None:
        """Call ``on_end`` when a newer stream replaces this one - at once if one already
        has (between taking the place and starting to wait)."""
        self.on_end = on_end
        if self.reason is not None:
            on_end(self.reason)

    def supersede(self, error: Superseded) -> None:
        self.reason = error
        self.ended.set()
        if self.on_end is not None:
            self.on_end(error)


class StreamBook:
    def __init__(self, budget_bytes: int = MEMORY_BUDGET_MIB * 1024 * 1024,
                 stream_bytes: int = STREAM_BYTES) -> None:
        self.budget_bytes = budget_bytes
        self.stream_bytes = stream_bytes
        self._live: dict[Key, Held] = {}
        self._bytes = 0
        self._kinds = dict.fromkeys(KINDS, 0)
        self.replaced = 0  # streams ended because a newer one took their identity
        self.refused = 0  # streams refused for the budget

    def __len__(self) -> int:
        return len(self._live)

    @property
    def bytes(self) -> int:
        """What the live streams are counted as holding."""
        return self._bytes

    def count(self, kind: str) -> int:
        return self._kinds.get(kind, 0)

    def max_streams(self) -> int:
        """Streams of the smallest identity that fit the budget (for the HTTP/2 setting)."""
        return max(1, self.budget_bytes // self.stream_bytes)

    def hold(self, kind: str, namespace: str, name: str, metadata: Mapping[str, str],
             peer: str) -> Held:
        """A place for a new stream: replaces the live one of the same identity (which
        ends with ``Superseded``); raises TooManyStreams when a new identity would pass
        the budget."""
        key: Key = (kind, namespace, name, tuple(sorted(metadata.items())))
        size = self.stream_bytes + len(namespace) + len(name) + sum(
            len(k) + len(v) for k, v in key[3])
        old = self._live.get(key)
        freed = old.size if old is not None else 0
        if self._bytes - freed + size > self.budget_bytes:
            self.refused += 1
            raise TooManyStreams(
                f"this scaler holds {len(self._live)} streams, {self._bytes / 2**20:.0f} MiB "
                f"of its {self.budget_bytes / 2**20:.0f} MiB stream budget "
                f"(--stream-memory-mib); add scaler replicas or raise the budget with the "
                f"scaler's memory limit")
        if old is not None:
            self.replaced += 1
            self._drop(old)
            old.supersede(Superseded(
                f"{namespace}/{name}: replaced by a newer {kind} for the same trigger "
                f"metadata (from {peer}); one live stream of each kind per trigger"))
        held = self._live[key] = Held(key, peer, size)
        self._bytes += size
        self._kinds[kind] = self._kinds.get(kind, 0) + 1
        return held

    def release(self, held: Held) -> None:
        """The stream ended (any way): its place is free unless a newer one took it."""
        if self._live.get(held.key) is held:
            self._drop(held)

    def _drop(self, held: Held) -> None:
        del self._live[held.key]
        self._bytes -= held.size
        self._kinds[held.key[0]] -= 1
