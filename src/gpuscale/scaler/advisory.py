"""Advisory plans: the planner run beside whatever scales a workload today, to try it before
switching. No trigger changes: the scaler's operator declares the workload in the scaler's
YAML configuration, and the scaler plans it every second from the same fleet view and the
same answer function a ``vllm-planner`` trigger would use::

    advisory:
      - namespace: llm
        name: chat                      # how it is shown (/metrics, the log)
        podSelector: app=vllm-chat      # the workload's pods
        gpusPerReplica: 1               # optional (default 1): GPUs each pod holds
        metadata:                       # optional: the vllm-planner trigger's keys
          ttftSeconds: "2"
          startupSeconds: "180"

Exported on the scaler's ``/metrics``: ``gpuscale_advisory_replicas{kind="planned"|"actual"}``
(the plan, and the workload's pods now), and over the last 24 hours
``gpuscale_advisory_gpu_hours{kind="planned"|"actual"}`` and
``gpuscale_advisory_saved_gpu_hours`` (actual less planned: negative when the plan would
have cost more) with ``gpuscale_advisory_known_seconds``, the seconds both were known.
A second in which either is not known (no plan, a pod without data, an agent that has not
reported) is counted in neither: the figures cover ``known_seconds``, never fill a gap
with zero, and ``gpuscale_advisory_unknown_seconds`` counts what they leave out.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from gpuscale.common.errors import ConfigError, Unavailable
from gpuscale.scaler.answers import Answers, Workload
from gpuscale.scaler.core.trigger import TriggerConfig, check_object_name, parse_metadata
from gpuscale.scaler.state.history import TriggerHistory

log = logging.getLogger(__name__)

ADVISORY = "advisory"  # the asker: advisory planners are kept apart from KEDA's
MAX_WORKLOADS = 100
WINDOW_S = 86_400.0  # the saved GPU-hours' window
BUCKET_S = 60.0  # its resolution
_KEYS = {"namespace", "name", "podSelector", "gpusPerReplica", "metadata"}


@dataclass(frozen=True, slots=True)
class AdvisoryWorkload:
    namespace: str
    name: str
    trigger: TriggerConfig  # a vllm-planner trigger with the workload's podSelector
    gpus_per_replica: float = 1.0
    metadata: Mapping[str, str] = field(default_factory=dict)  # the trigger's, as parsed

    @property
    def workload(self) -> Workload:
        return Workload(self.namespace, self.name, self.trigger, source=ADVISORY)


def parse_advisory(raw: object) -> tuple[AdvisoryWorkload, ...]:
    """The ``advisory`` list of the scaler's configuration. Raises ConfigError naming the
    entry and the key."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError("advisory: expected a list of workloads")
    if len(raw) > MAX_WORKLOADS:
        raise ConfigError(f"advisory: {len(raw)} workloads, at most {MAX_WORKLOADS}")
    out: list[AdvisoryWorkload] = []
    seen: set[tuple[str, str]] = set()
    for i, entry in enumerate(raw):
        where = f"advisory[{i}]"
        try:
            got = _entry(entry)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        if (got.namespace, got.name) in seen:
            raise ConfigError(f"{where}: {got.namespace}/{got.name} is declared twice")
        seen.add((got.namespace, got.name))
        out.append(got)
    return tuple(out)


def _entry(entry: object) -> AdvisoryWorkload:
    if not isinstance(entry, dict):
        raise ConfigError("expected a mapping")
    unknown = sorted(str(k)[:40] for k in set(entry) - _KEYS)
    if unknown:
        raise ConfigError(f"unknown key(s) {unknown[:5]}; allowed: "
                          f"{', '.join(sorted(_KEYS))}")
    texts = {}
    for key in ("namespace", "name", "podSelector"):
        value = entry.get(key)
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{key}: required, a string")
        texts[key] = value
    check_object_name(texts["namespace"], texts["name"])
    metadata = entry.get("metadata") or {}
    if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise ConfigError("metadata: a mapping of strings to strings, as a trigger's "
                          "metadata (quote numbers: \"2\")")
    for key in ("profile", "podSelector", "signal"):
        if key in metadata:
            raise ConfigError(f"metadata: {key} is set by the advisory entry itself")
    full = {**metadata, "profile": "vllm-planner", "podSelector": texts["podSelector"]}
    trigger = parse_metadata(full)
    gpus = entry.get("gpusPerReplica", 1)
    if isinstance(gpus, bool) or not isinstance(gpus, int | float) \
            or not math.isfinite(gpus) or not 0 < gpus <= 64:
        raise ConfigError(f"gpusPerReplica: a number above 0 and at most 64, got {gpus!r:.40}")
    return AdvisoryWorkload(texts["namespace"], texts["name"], trigger, float(gpus), full)


@dataclass(slots=True)
class Ledger:
    """One workload's last ``WINDOW_S``: per ``BUCKET_S`` bucket, the seconds both counts
    were known and the GPU-seconds planned and actual in them, and the unknown seconds."""

    buckets: deque[list[float]] = field(default_factory=deque)  # [start, known, plan, act, ?]
    planned: int | None = None  # now (None: not known)
    actual: int | None = None
    why: str = ""  # why not known, now

    def add(self, now: float, seconds: float, planned: int | None, actual: int | None,
            gpus: float) -> None:
        start = math.floor(now / BUCKET_S) * BUCKET_S
        if not self.buckets or self.buckets[-1][0] != start:
            self.buckets.append([start, 0.0, 0.0, 0.0, 0.0])
        while self.buckets and self.buckets[0][0] <= now - WINDOW_S:
            self.buckets.popleft()
        b = self.buckets[-1]
        if planned is None or actual is None:
            b[4] += seconds
            return
        b[1] += seconds
        b[2] += planned * gpus * seconds
        b[3] += actual * gpus * seconds

    def totals(self) -> tuple[float, float, float, float]:
        """(known seconds, planned GPU-hours, actual GPU-hours, unknown seconds)."""
        known = sum(b[1] for b in self.buckets)
        return (known, sum(b[2] for b in self.buckets) / 3600.0,
                sum(b[3] for b in self.buckets) / 3600.0, sum(b[4] for b in self.buckets))


class Advisor:
    """Plans each advisory workload once a ``period_s`` through the answer function and
    keeps its ledger. ``history``: where KEDA's asks are noted, so ``gpuscale explain``
    (the recorder) shows an advisory workload as it shows a ScaledObject - planned
    replicas beside the pods it runs - unless KEDA asks about one of the same name."""

    def __init__(self, answers: Answers, workloads: Iterable[AdvisoryWorkload],
                 clock: Callable[[], float], period_s: float = 1.0,
                 history: TriggerHistory | None = None) -> None:
        self.answers = answers
        self.history = history
        self.workloads = tuple(workloads)
        self.clock = clock
        self.period_s = period_s
        self.ledgers: dict[tuple[str, str], Ledger] = {
            (w.namespace, w.name): Ledger() for w in self.workloads}
        self._last: float | None = None

    def tick(self) -> None:
        now = self.clock()
        seconds = 0.0 if self._last is None else min(max(0.0, now - self._last),
                                                     10 * self.period_s)
        self._last = now
        for w in self.workloads:
            if self.history is not None:
                self.history.note(w.namespace, w.name, w.metadata, w.trigger, now, ADVISORY)
            ledger = self.ledgers[(w.namespace, w.name)]
            planned, actual, why = self._counts(w)
            ledger.planned, ledger.actual, ledger.why = planned, actual, why
            if seconds > 0:
                ledger.add(now, seconds, planned, actual, w.gpus_per_replica)

    def _counts(self, w: AdvisoryWorkload) -> tuple[int | None, int | None, str]:
        workload = w.workload
        selection = self.answers.selection(workload)
        if isinstance(selection, Unavailable):
            return None, None, selection.reason
        if selection.gaps:  # pods or agents not heard from: the count would be too small
            return None, None, "not every pod has reported: " + "; ".join(selection.gaps)
        actual = len(selection.pods)
        got = self.answers.value(workload, w.trigger.targets[0])
        if isinstance(got, Unavailable) or got.plan is None:
            why = got.reason if isinstance(got, Unavailable) else "no plan"
            return None, actual, why
        return got.plan.replicas, actual, ""

    async def run(self) -> None:
        while True:
            try:
                self.tick()
            except Exception:  # a bug in one tick is logged, the next tick tries again
                log.exception("advisory plans: tick failed")
            await asyncio.sleep(self.period_s)

    def state(self) -> Mapping[tuple[str, str], Ledger]:
        return self.ledgers
