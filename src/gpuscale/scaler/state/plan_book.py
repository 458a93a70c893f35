"""The planners of the workloads KEDA asks about, ticked once a second from the fleet view.

KEDA polls a scaler every ``pollingInterval`` (30 s by default), and the HPA reads the
metric every 15 s; the planner needs every second. So a workload's planner is created the
first time KEDA asks about it, observed by ``PlanBook.tick`` once a second (the scaler runs
the loop), and forgotten when nobody has asked for ``IDLE_S``. The answer to KEDA is the
latest plan, from memory.

An observation is the sum over the workload's pods of the planner's signals, made by
``evaluate`` with the same rules as every other answer: a Ready pod without a usable value,
a stale one, or a gap the roster found makes the observation fail (the planner keeps the
reason and, once its plan is older than its staleness bound, answers UNAVAILABLE with it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass

from gpuscale.common.errors import DataUnavailable, Overloaded, Unavailable
from gpuscale.scaler.core.aggregate import evaluate
from gpuscale.scaler.core.planner import Observation, Plan, Planner, PlannerConfig, PodLoad
from gpuscale.scaler.core.profiles import Target, ValueMode
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.stream.records import PodRecord

log = logging.getLogger(__name__)

IDLE_S = 900.0  # a planner nobody asked about for this long is dropped
CHUNK = 50  # planned workloads observed between two turns of the event loop
MAX_WORKLOADS = 1_000  # ~165 KiB of history each (tracemalloc): inside the scaler's 512 MiB

#: The per-pod signals an observation sums (engines.signals names them).
PLANNER_SIGNALS = ("vllm-prompt-tps", "vllm-generation-tps", "vllm-finished-rate",
                   "vllm-waiting", "vllm-running", "vllm-kv-cache")


_POD_LOAD = ("vllm-prompt-tps", "vllm-generation-tps", "vllm-waiting")


class TooManyPlans(Overloaded):
    """More distinct planned workloads than the scaler keeps."""


def observe(fleet: FleetView, pods: Sequence[PodRecord], gaps: Sequence[str],
            startups: tuple[tuple[str, float], ...] = ()) -> Observation:
    """The workload's sums now, and its pods' measured start-ups (passed through). Raises
    WorkloadUnavailable (naming pods and why)."""
    sums = {}
    ready = 0
    for name in PLANNER_SIGNALS:
        got = evaluate(fleet, pods, Target(name, 1.0, 0.0), ValueMode.SUM, gaps)
        sums[name] = got.value
        ready = got.ready
    # Each Ready pod's own load (the sums above checked that every one has it; a pod
    # that has not is left out of the capacity, never counted as idle).
    loads = []
    for p in pods:
        values = [v for v in (p.signals.get(name) for name in _POD_LOAD)
                  if isinstance(v, float | int)]
        if p.ready and len(values) == len(_POD_LOAD):
            loads.append(PodLoad(f"{p.namespace}/{p.name}", *map(float, values)))
    return Observation(
        prompt_tps=sums["vllm-prompt-tps"], generation_tps=sums["vllm-generation-tps"],
        finished_rate=sums["vllm-finished-rate"], waiting=sums["vllm-waiting"],
        running=sums["vllm-running"], kv_cache=sums["vllm-kv-cache"], ready=ready,
        starting=sum(1 for p in pods if not p.ready), pods=tuple(loads), startups=startups)


@dataclass(slots=True)
class _Entry:
    planner: Planner
    asked_at: float
    label: tuple[str, str]  # namespace, ScaledObject name (for /metrics)


Sample = Callable[[], Observation]  # raises DataUnavailable


class PlanBook:
    """Planners by key (the ScaledObject and its trigger's configuration)."""

    def __init__(self, max_workloads: int = MAX_WORKLOADS, idle_s: float = IDLE_S,
                 time_scale: float = 1.0) -> None:
        """``time_scale``: planner seconds per second of the caller's clock (1; the
        fast-forwarded demo runs its planners on simulated time). ``tick`` should run once
        per planner second: every ``period`` seconds of the caller's clock."""
        self._entries: dict[Hashable, _Entry] = {}
        self.time_scale = time_scale
        self.period = 1.0 / time_scale
        self._samplers: dict[Hashable, Sample] = {}
        self.max_workloads = max_workloads
        self.idle_s = idle_s

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def plan(self, key: Hashable, label: tuple[str, str], config: PlannerConfig,
             sample: Sample, now: float) -> Plan:
        """The workload's current plan; the first ask creates its planner and observes at
        once. Raises PlanUnavailable (DataUnavailable), TooManyPlans."""
        entry = self._entries.get(key)
        if entry is None:
            if len(self._entries) >= self.max_workloads:
                raise TooManyPlans(f"this scaler already plans {len(self._entries)} "
                                   f"workloads (limit {self.max_workloads}); shard the "
                                   "ScaledObjects over more scalers")
            entry = self._entries[key] = _Entry(Planner(config), now, label)
            self._samplers[key] = sample
            self._observe(entry.planner, sample, now * self.time_scale)
        entry.asked_at = now
        self._samplers[key] = sample  # the newest way to read the pods
        return entry.planner.current(now * self.time_scale)

    def keys(self) -> list[Hashable]:
        return list(self._entries)

    def tick(self, now: float, keys: Iterable[Hashable] | None = None) -> None:
        """Observe every planned workload (or those of ``keys``) once; drop the ones nobody
        asks about."""
        for key in self.keys() if keys is None else keys:
            entry = self._entries.get(key)
            if entry is None:
                continue
            if now - entry.asked_at > self.idle_s:
                del self._entries[key]
                del self._samplers[key]
                continue
            self._observe(entry.planner, self._samplers[key], now * self.time_scale)

    async def run(self, now: Callable[[], float], stopping: asyncio.Event,
                  period: float | None = None, chunk: int = CHUNK) -> None:
        """Observe every planned workload each ``period`` (default: one planner second)
        until ``stopping`` is set, ``chunk`` workloads at a time, so answers to KEDA wait
        for one chunk at most. ``now``: the fleet view's clock."""
        period = self.period if period is None else period
        while not stopping.is_set():
            keys = self.keys()
            for i in range(0, len(keys), chunk):
                self.tick(now(), keys[i:i + chunk])
                await asyncio.sleep(0)
            with suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), period)

    @staticmethod
    def _observe(planner: Planner, sample: Sample, now: float) -> None:
        try:
            planner.observe(now, sample())
        except DataUnavailable as exc:
            planner.fail(now, str(exc))
        except Exception as exc:  # a bug in one workload must not stop every planner
            log.error("planner observation failed: %s", exc, exc_info=exc)
            planner.fail(now, f"internal error in gpuscale ({type(exc).__name__}); see the "
                              "scaler's log")

    def problems(self) -> dict[tuple[str, str], str]:
        """(namespace, name) -> why its planner's latest observation failed, for those
        whose did."""
        return {e.label: e.planner.problem for e in self._entries.values()
                if e.planner.problem is not None}

    def peek(self, key: Hashable, now: float) -> Plan | Unavailable | None:
        """The plan ``plan`` would give now, or why it would be UNAVAILABLE; None when no
        planner is kept under ``key``. Read-only: no planner created, none kept alive."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        try:
            return entry.planner.current(now * self.time_scale)
        except DataUnavailable as exc:
            return Unavailable(str(exc))

    def plans(self) -> Iterator[tuple[tuple[str, str], Plan]]:
        """(namespace, name) and the latest plan of every workload that has one."""
        for entry in self._entries.values():
            if entry.planner.plan is not None:
                yield entry.label, entry.planner.plan
