"""The scaler's recent past, recorded: what it would answer for each ScaledObject KEDA asks
about, every step, and every device's use (scaler.state.history keeps them, bounded).

A moment is made by the one answer function (scaler.answers) in its read-only form: what
``gpuscale explain`` shows now or at a past time is what KEDA was given, and reading it
creates no planner and keeps none alive. Nothing on KEDA's request path waits for this.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from gpuscale.common.errors import GpuscaleError, Unavailable
from gpuscale.common.freshness import is_stale
from gpuscale.scaler.answers import Answers, Plans, Selection, Workload
from gpuscale.scaler.state.history import (
    MAX_NAMED,
    STEP_S,
    AskedTrigger,
    DeviceHistory,
    RecordedAnswers,
    TargetAnswer,
    TriggerHistory,
    owner_text,
)
from gpuscale.stream.records import DeviceRecord

if TYPE_CHECKING:
    from gpuscale.stream.subscriber import LinkState

log = logging.getLogger(__name__)

DEVICE_STEP_S = 15.0  # devices sampled this often (four utilization samples a minute)
CHUNK = 10  # ScaledObjects recorded between two turns of the event loop
NODE_CHUNK = 10  # nodes' devices (80 GPUs) sampled between two turns

Links = Callable[[], Iterable["LinkState"]]


def moment(answers: Answers, namespace: str, name: str, asked: AskedTrigger,
           at: float) -> tuple[RecordedAnswers, Selection | None]:
    """What the scaler answers now for each target of the trigger KEDA asked about, read
    only (``Plans.PEEK``), and the selection it read (None when it could not select)."""
    cfg = asked.config
    workload = Workload(namespace, name, cfg, asked.selector, asked.source)
    selection: Selection | None = None
    whole = ""
    try:
        got = answers.selection(workload)
        if isinstance(got, Unavailable):
            whole = got.reason
        else:
            selection = got
    except GpuscaleError as exc:  # a trigger this scaler cannot use
        whole = str(exc)
    out = []
    plan = None
    values = [answers.value(workload, t, Plans.PEEK,
                            selection if selection is not None else Unavailable(whole))
              for t in cfg.targets]
    try:
        active = answers.activity(workload, values)  # IsActive's, by the same rule
    except GpuscaleError as exc:  # a demand source this scaler does not declare
        active = Unavailable(str(exc))
    for t, value in zip(cfg.targets, values, strict=True):
        base = TargetAnswer(cfg.metric_name(t), t.signal, t.target, t.activation)
        if isinstance(value, Unavailable):
            out.append(replace(base, unavailable=value.reason))
            continue
        plan = value.plan or plan
        out.append(replace(base, value=value.value, counted=value.counted,
                           starting=value.starting, ready=value.ready))
    pods = len(selection.pods) if selection is not None else 0
    gaps = selection.gaps if selection is not None else ()
    recorded = RecordedAnswers(at, tuple(out), pods,
                               plan.replicas if plan is not None else -1,
                               tuple(plan.terms().items()) if plan is not None else (),
                               tuple(gaps[:MAX_NAMED]), answers.pending(workload),
                               None if isinstance(active, Unavailable) else active,
                               active.reason if isinstance(active, Unavailable) else "")
    return recorded, selection


class Recorder:
    """Writes the history every step (``step_s``, default STEP_S) for each ScaledObject
    KEDA asked about within the kept history, and samples every device every
    DEVICE_STEP_S (or the step, if shorter)."""

    def __init__(self, answers: Answers, history: TriggerHistory, links: Links | None = None,
                 wall: Callable[[], float] = time.time, step_s: float = STEP_S) -> None:
        """``links``: the subscriber's agent links (None where the fleet view is fed in
        the same process: the scenario demo)."""
        self.answers = answers
        self.history = history
        self.links = links
        self.wall = wall
        self.devices = DeviceHistory(keep_s=history.keep_s)
        history.step_s = step_s  # before any ScaledObject is noted (ring sizes)

    def moment(self, namespace: str, name: str,
               asked: AskedTrigger) -> tuple[RecordedAnswers, Selection | None]:
        return moment(self.answers, namespace, name, asked, self.wall())

    def live_devices(self) -> dict[str, Sequence[DeviceRecord]]:
        """The devices of nodes heard from within their agent's own staleness bound, by
        node name (the agent's identity where the links know it, else its address). A
        silent or departed agent's last readings are not data: its minutes stay absent
        rather than repeat."""
        fleet = self.answers.fleet
        ages, bounds = fleet.nodes(), fleet.bounds()
        names = {s.address: s.identity for s in self.links()} if self.links else {}
        return {names.get(node) or node: devs for node, devs in fleet.devices().items()
                if not is_stale(ages.get(node, math.inf),
                                bounds.get(node, fleet.stale_after))}

    async def run(self, chunk: int = CHUNK) -> None:
        """Record until cancelled."""
        period = min(self.history.step_s, DEVICE_STEP_S)  # devices at least this often
        last_moments = -math.inf
        while True:
            started = time.monotonic()
            try:
                await self._sample_devices(NODE_CHUNK)
                if started - last_moments >= self.history.step_s - period / 2:
                    last_moments = started
                    items = self.history.items()
                    for i in range(0, len(items), chunk):
                        self._record(items[i:i + chunk])
                        await asyncio.sleep(0)
            except Exception as exc:  # a bug here must not end the scaler
                log.error("recording the history failed: %s", exc, exc_info=exc)
            await asyncio.sleep(max(0.0, period - (time.monotonic() - started)))

    async def _sample_devices(self, chunk: int) -> None:
        """Every live node's devices, ``chunk`` nodes between two turns of the event loop
        (8,000 GPUs at once held every answer for ~90 ms, bench_keda)."""
        now, live = self.wall(), list(self.live_devices().items())
        for i in range(0, len(live), chunk):
            self.devices.sample_nodes(now, live[i:i + chunk], self._owner_of)
            await asyncio.sleep(0)

    def _owner_of(self, holder: str) -> str:
        """A device holder's ("namespace/pod") owner, looked up when its device is sampled:
        a map of all 8,000 pods' owners made at once held the event loop for 7-15 ms
        every DEVICE_STEP_S."""
        namespace, _, name = holder.partition("/")
        return owner_text(self.answers.fleet.pod(namespace, name))

    def record_now(self) -> None:
        """One step of ``run`` at once (all ScaledObjects, no yielding)."""
        self.devices.sample(self.wall(), self.live_devices(), self.answers.fleet.pods())
        self._record(self.history.items())

    def _record(self, items: Iterable[tuple[tuple[str, str], AskedTrigger]]) -> None:
        now = self.answers.fleet.now()
        for (ns, name), asked in items:
            if now - asked.asked_at <= self.history.keep_s:
                try:
                    self.history.record(ns, name, self.moment(ns, name, asked)[0])
                except Exception as exc:  # one ScaledObject's bug must not stop the rest
                    log.error("recording %s/%s failed: %s", ns, name, exc, exc_info=exc)
