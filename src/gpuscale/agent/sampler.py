"""The sampler: reads the backend at a fixed cadence and publishes the latest snapshot.

The backend's blocking calls run in one dedicated worker thread, one at a time, so NVML never
blocks the event loop and never sees two callers. Ticks are aligned to ``start + k*interval``;
a sample that overruns skips the ticks it missed instead of bunching them. A backend that
raises (a bug - faults are states) is logged with its traceback and counted, and the loop
goes on; the last good snapshot then ages and /readyz turns false.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

from prometheus_client import CollectorRegistry, Counter, Histogram

from gpuscale.attribution.model import AttributionState, NodeAttribution
from gpuscale.common.freshness import is_stale, staleness_bound
from gpuscale.telemetry.backend import GpuBackend
from gpuscale.telemetry.model import BackendState, NodeSnapshot

log = logging.getLogger(__name__)

MIN_INTERVAL_S = 0.2

Attributor = Callable[[NodeSnapshot], Awaitable[NodeAttribution]]
Listener = Callable[[NodeSnapshot, NodeAttribution | None], None]


class Sampler:
    def __init__(self, backend: GpuBackend, interval: float, registry: CollectorRegistry,
                 monotonic: Callable[[], float] = time.monotonic,
                 attributor: Attributor | None = None) -> None:
        if not interval >= MIN_INTERVAL_S:
            raise ValueError(f"sample interval must be at least {MIN_INTERVAL_S} s, "
                             f"got {interval}")
        self.backend = backend
        self.interval = interval
        self._monotonic = monotonic
        self._latest: NodeSnapshot | None = None
        self._attribution: NodeAttribution | None = None
        self._attributor = attributor
        self._listeners: list[Listener] = []
        self._seq = 0
        self._published = asyncio.Condition()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpu-sampler")
        self._duration = Histogram(
            "gpuscale_agent_sample_duration_seconds", "Time one backend sample took.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=registry)
        self._failures = Counter(
            "gpuscale_agent_sample_failures", "Samples whose backend raised (a bug).",
            registry=registry)
        self._problems = Counter(
            "gpuscale_agent_reading_problems",
            "Readings that failed (unsupported readings are not counted).", registry=registry)
        self._skipped = Counter(
            "gpuscale_agent_ticks_skipped", "Ticks skipped because a sample overran.",
            registry=registry)

    @property
    def latest(self) -> NodeSnapshot | None:
        """The most recent snapshot, or None before the first sample finished."""
        return self._latest

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(snapshot, attribution)`` after each publish (on the event loop;
        it must be quick and must not raise - a raising listener is logged and skipped)."""
        self._listeners.append(listener)

    @property
    def attribution(self) -> NodeAttribution | None:
        """Who uses which GPU, for the latest snapshot (None without an attributor)."""
        return self._attribution

    @property
    def stale_after(self) -> float:
        """Seconds after which the latest snapshot no longer counts as fresh."""
        return staleness_bound(self.interval)

    def readiness(self) -> tuple[bool, str]:
        """Ready when a sample succeeded and the latest is fresh; the reason when not."""
        snap = self._latest
        if snap is None:
            return False, "no sample has completed yet"
        if snap.state is not BackendState.OK:
            return False, f"GPU backend {snap.backend} unavailable: {snap.reason}"
        age = self._monotonic() - snap.monotonic
        if is_stale(age, self.stale_after):
            return False, f"latest sample is {age:.1f}s old (bound {self.stale_after:.1f}s)"
        why = f"ok: {len(snap.gpus)} GPUs, sample {snap.seq}, {age:.2f}s old"
        att = self._attribution
        if att is not None and att.state is not AttributionState.OK:
            # Device metrics are still served: ready, but say what attribution lacks.
            why += f"; attribution {att.state.value}: {'; '.join(att.reasons)}"
        return True, why

    async def sample_once(self) -> NodeSnapshot:
        """Take one sample in the worker thread and publish it."""
        loop = asyncio.get_running_loop()
        snap = await loop.run_in_executor(self._executor, self.backend.sample)
        self._seq += 1
        snap = dataclasses.replace(snap, seq=self._seq)
        self._duration.observe(snap.duration_seconds)
        if snap.problems:
            self._problems.inc(len(snap.problems))
        attribution = None
        if self._attributor is not None:
            try:
                attribution = await self._attributor(snap)
            except asyncio.CancelledError:
                raise
            except Exception:
                # A bug in attribution must not stop device metrics: log, publish without.
                self._failures.inc()
                log.exception("attribution failed; publishing device metrics only")
                attribution = NodeAttribution(AttributionState.UNAVAILABLE,
                                              ("attribution failed (see the agent log)",))
        async with self._published:
            self._latest = snap
            self._attribution = attribution
            self._published.notify_all()
        for listener in self._listeners:
            try:
                listener(snap, attribution)
            except Exception:
                log.exception("snapshot listener failed")
        return snap

    async def wait_for(self, seq: int) -> NodeSnapshot:
        """Wait until a snapshot with sequence number >= ``seq`` is published."""
        async with self._published:
            await self._published.wait_for(
                lambda: self._latest is not None and self._latest.seq >= seq)
            assert self._latest is not None
            return self._latest

    async def run(self, ready: Callable[[], None] | None = None) -> None:
        """Sample forever at the configured cadence; call ``ready`` after the first sample."""
        start = self._monotonic()
        tick = 0
        try:
            while True:
                try:
                    await self.sample_once()
                except asyncio.CancelledError:
                    raise
                except Exception:
                    self._failures.inc()
                    log.exception("GPU sample failed; will retry next tick")
                if ready is not None and tick == 0:
                    ready()
                tick += 1
                now = self._monotonic()
                due = start + tick * self.interval
                if now > due:
                    missed = int((now - due) // self.interval) + 1
                    self._skipped.inc(missed)
                    tick += missed
                    due = start + tick * self.interval
                await asyncio.sleep(due - now)
        finally:
            # Shut the worker down without waiting on an NVML call in flight.
            self._executor.shutdown(wait=False, cancel_futures=True)
