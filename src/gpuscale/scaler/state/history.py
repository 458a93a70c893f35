"""The scaler's recent past, bounded, for the operator tools (``gpuscale explain --at``,
``gpuscale idle``): what it would have answered for each ScaledObject every STEP_S, and
each device's allocation and utilization per minute. Nothing on KEDA's request path reads
or writes it; a loop records it (scaler.edges.inspect).

Bounds (the worst case is what a scaler must have memory for): MAX_TRIGGERS ScaledObjects
x KEEP_S / STEP_S moments, and MAX_DEVICES devices x KEEP_S / 60 minutes. Past the
trigger bound, the ScaledObject KEDA asked about least recently is forgotten first.
"""

from __future__ import annotations

import math
import time
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from gpuscale.scaler.core.selector import Selector
from gpuscale.scaler.core.trigger import TriggerConfig
from gpuscale.stream.records import DeviceRecord, PodRecord

STEP_S = 30.0  # one moment per ScaledObject this often (KEDA's default polling interval)
KEEP_S = 3600.0  # how far back the history goes
MINUTE_S = 60.0
MAX_TRIGGERS = 2000
MAX_DEVICES = 20_000
MAX_NAMED = 5  # missing pods kept per moment


@dataclass(frozen=True, slots=True)
class TargetAnswer:
    """What the scaler answers (or would) for one target of a trigger."""

    metric_name: str
    signal: str
    target: float
    activation: float
    value: float = 0.0
    unavailable: str = ""  # the UNAVAILABLE reason; "" when ``value`` holds
    counted: int = 0
    starting: int = 0
    ready: int = 0


@dataclass(frozen=True, slots=True)
class RecordedAnswers:
    at: float  # wall seconds
    answers: tuple[TargetAnswer, ...]
    pods: int  # pods of the selection in the fleet view
    planned: int = -1  # the planner's replicas (-1: not planned, or no plan)
    terms: tuple[tuple[str, float], ...] = ()
    missing: tuple[str, ...] = ()
    demand: str = ""  # the demand source's word ("pending", "none", why not) or ""
    active: bool | None = None  # IsActive's answer (scaler.answers.activity); None: not
    #   known - UNAVAILABLE with ``inactive_unknown`` as the reason, or not recorded
    inactive_unknown: str = ""


@dataclass(slots=True)
class AskedTrigger:
    """A ScaledObject KEDA asked about: its metadata as sent, when last asked."""

    metadata: Mapping[str, str]
    config: TriggerConfig
    asked_at: float  # monotonic
    moments: deque[RecordedAnswers] = field(default_factory=deque)
    source: str = "keda"  # who asks (answers.Workload.source): KEDA, advisory plans, or
    #   the metrics API (an HPA's read of a Deployment's or StatefulSet's value)
    selector: Selector | None = None  # the pods, resolved by the asker (answers.Workload
    #   .selector: the metrics API's); None: the trigger's podSelector or the ScaledObject's


class TriggerHistory:
    def __init__(self, max_triggers: int = MAX_TRIGGERS, keep_s: float = KEEP_S,
                 step_s: float = STEP_S) -> None:
        self._seen: OrderedDict[tuple[str, str], AskedTrigger] = OrderedDict()
        self.max_triggers = max_triggers
        self.keep_s = keep_s
        self.step_s = step_s

    def note(self, namespace: str, name: str, metadata: Mapping[str, str],
             config: TriggerConfig, now: float, source: str = "keda",
             selector: Selector | None = None) -> None:
        """KEDA asked about ``namespace/name`` (called on every request: O(1), no copy of
        the metadata unless the trigger's configuration changed). ``source``: who asks;
        another asker's note does not replace KEDA's trigger of the same name.
        ``selector``: the pods as the asker resolved them (the metrics API's workloads,
        named "Kind/name"), so a moment reads the asker's selection and plan."""
        key = (namespace, name)
        seen = self._seen.get(key)
        if seen is None:
            if len(self._seen) >= self.max_triggers:
                self._seen.popitem(last=False)
            self._seen[key] = AskedTrigger(dict(metadata), config, now,
                                   deque(maxlen=max(1, int(self.keep_s / self.step_s))),
                                   source, selector)
            return
        if seen.source != source:
            if source != "keda":
                return
            seen.source, seen.moments = source, deque(maxlen=seen.moments.maxlen)
        if seen.config is not config:
            seen.metadata, seen.config = dict(metadata), config
        seen.selector = selector
        seen.asked_at = now
        self._seen.move_to_end(key)

    def get(self, namespace: str, name: str) -> AskedTrigger | None:
        return self._seen.get((namespace, name))

    def items(self) -> list[tuple[tuple[str, str], AskedTrigger]]:
        return list(self._seen.items())

    def record(self, namespace: str, name: str, moment: RecordedAnswers) -> None:
        seen = self._seen.get((namespace, name))
        if seen is not None:
            seen.moments.append(moment)

    def at(self, namespace: str, name: str, when: float) -> tuple[RecordedAnswers | None, str]:
        """The moment nearest ``when`` (wall seconds) within one step, or why none."""
        seen = self._seen.get((namespace, name))
        if seen is None or not seen.moments:
            return None, f"no history for {namespace}/{name} in this scaler"
        first, last = seen.moments[0].at, seen.moments[-1].at
        if when < first - self.step_s or when > last + self.step_s:
            return None, (f"{namespace}/{name}: the history this scaler keeps runs from "
                          f"{_utc(first)} to {_utc(last)} ({_moments(len(seen.moments))}, "
                          f"one every {self.step_s:g} s while KEDA asks); that is "
                          f"{_utc(when)}, {'before' if when < first else 'after'} it")
        best = min(seen.moments, key=lambda m: abs(m.at - when))
        if abs(best.at - when) > 1.5 * self.step_s:  # a gap: KEDA stopped asking, or a stall
            return None, (f"{namespace}/{name}: nothing recorded near {_utc(when)} (the "
                          f"nearest moment, {_utc(best.at)}, is {abs(best.at - when):.0f} s "
                          f"away: KEDA did not ask in between)")
        return best, ""

    def before(self, namespace: str, name: str, when: float,
               span: float) -> list[RecordedAnswers]:
        """The moments in (``when`` - ``span``, ``when``], oldest first."""
        seen = self._seen.get((namespace, name))
        if seen is None:
            return []
        return [m for m in seen.moments if when - span < m.at <= when]


@dataclass(slots=True)
class MinuteUse:
    start: float  # wall seconds, a multiple of MINUTE_S
    pods: tuple[str, ...]
    owners: tuple[str, ...]
    util_sum: float = 0.0
    samples: int = 0


class DeviceLog:
    """One device's minutes in a fixed ring of slots (minute number modulo the slots):
    plain arrays, so a device costs ~2 KiB however full (a MinuteUse per minute cost
    ~170 bytes each: 200 MiB at the device bound, bench/bench_inspect.py)."""

    __slots__ = ("_owners", "_pods", "_samples", "_starts", "_util", "fraction",
                 "fraction_known", "model", "node")

    def __init__(self, node: str, model: str, fraction: float, slots: int) -> None:
        self.node, self.model, self.fraction = node, model, fraction
        self.fraction_known = True  # False: a MIG instance whose share is not read yet
        self._starts = array("d", [-1.0]) * slots
        self._util = array("d", [0.0]) * slots
        self._samples = array("I", [0]) * slots
        empty: tuple[str, ...] = ()
        self._pods = [empty] * slots
        self._owners = [empty] * slots

    def add(self, start: float, pods: tuple[str, ...], owners: tuple[str, ...],
            utilization: float | None) -> None:
        i = int(start // MINUTE_S) % len(self._starts)
        last = (i - 1) % len(self._starts)
        if pods == self._pods[last] and owners == self._owners[last]:
            pods, owners = self._pods[last], self._owners[last]  # share, not copy
        if self._starts[i] != start:  # a new minute: the slot's old one is forgotten
            self._starts[i], self._util[i], self._samples[i] = start, 0.0, 0
            self._pods[i], self._owners[i] = pods, owners
        elif pods and pods != self._pods[i]:  # allocation changed within the minute
            merged = tuple(sorted({*self._pods[i], *pods}))
            known = dict(zip(self._pods[i], self._owners[i], strict=True))
            known.update(zip(pods, owners, strict=True))
            self._pods[i], self._owners[i] = merged, tuple(known[p] for p in merged)
        if utilization is not None:
            self._util[i] += utilization
            self._samples[i] += 1

    def minutes(self, since: float) -> list[MinuteUse]:
        """The minutes that end after ``since``, oldest first."""
        out = [MinuteUse(start, self._pods[i], self._owners[i], self._util[i],
                         self._samples[i])
               for i, start in enumerate(self._starts)
               if start >= 0 and start + MINUTE_S > since]
        out.sort(key=lambda m: m.start)
        return out


def _moments(n: int) -> str:
    return f"{n} moment{'' if n == 1 else 's'}"


def _utc(when: float) -> str:
    """Wall seconds as a person reads them (the explain tool's --at refusals)."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(when))


def owner_text(pod: PodRecord | None) -> str:
    """A pod's owner as DeviceHistory keeps it: "kind/name", "" when none or unknown."""
    return f"{pod.owner.kind}/{pod.owner.name}" if pod is not None and pod.owner else ""


def owners(pods: Iterable[PodRecord]) -> dict[str, str]:
    """namespace/pod -> its owner (``owner_text``), for DeviceHistory."""
    return {f"{p.namespace}/{p.name}": owner_text(p) for p in pods}


class DeviceHistory:
    """Per device (node, UUID): allocation and mean utilization per minute."""

    def __init__(self, max_devices: int = MAX_DEVICES, keep_s: float = KEEP_S) -> None:
        self._logs: OrderedDict[tuple[str, str], DeviceLog] = OrderedDict()
        self.max_devices = max_devices
        self.keep_s = keep_s
        self._slots = max(1, int(keep_s / MINUTE_S)) + 1
        self.untracked: set[tuple[str, str]] = set()  # devices refused at the bound

    def sample(self, now: float, devices: Mapping[str, Sequence[DeviceRecord]],
               pods: Iterable[PodRecord]) -> None:
        """One sample of every node's devices at wall time ``now``: utilization (absent
        readings are not counted) and who holds each device."""
        known = owners(pods)
        self.sample_nodes(now, devices.items(), lambda pod: known.get(pod, ""))

    def sample_nodes(self, now: float,
                     nodes: Iterable[tuple[str, Sequence[DeviceRecord]]],
                     owner_of: Callable[[str], str]) -> None:
        """``sample`` for some of the nodes (a large fleet is sampled in slices, so the
        scaler's answers are not held up by all of it at once); ``owner_of``: a holder's
        ("namespace/pod") owner, as ``owner_text`` writes it."""
        start = math.floor(now / MINUTE_S) * MINUTE_S
        for node, devs in nodes:
            gpus = {d.uuid: d for d in devs if not d.parent_uuid}
            for d in devs:
                if d.sharing == "mig":
                    continue  # a GPU split into MIG: its instances are the devices
                held = tuple(d.pods)
                util = (float(d.utilization) if isinstance(d.utilization, float | int)
                        else None)
                log = self._log(node, d, gpus)
                if log is not None:
                    log.add(start, held, tuple(owner_of(p) for p in held), util)

    def _log(self, node: str, d: DeviceRecord,
             gpus: Mapping[str, DeviceRecord]) -> DeviceLog | None:
        key = (node, d.uuid)
        log = self._logs.get(key)
        parent = gpus.get(d.parent_uuid)
        if log is None:
            if len(self._logs) >= self.max_devices:
                # Refused, not evicted: evicting would rebuild every log every step once
                # a fleet is past the bound. Said in Usage (``untracked``).
                self.untracked.add(key)
                if len(self.untracked) > 4 * self.max_devices:
                    self.untracked.clear()  # a count, bounded; re-learned next step
                return None
            model = f"{parent.model} {d.model}" if parent is not None else d.model
            log = self._logs[key] = DeviceLog(node, model, 1.0, self._slots)
            log.fraction_known = not d.parent_uuid
            if d.parent_uuid:  # until the memory totals are read: the profile's slices
                log.fraction = _profile_share(d.model, parent.model if parent else "")
        if not log.fraction_known and parent is not None:
            # a MIG instance: its share of the GPU's memory, once both totals are read
            mine, whole = d.memory_total_mib, parent.memory_total_mib
            if isinstance(mine, float | int) and isinstance(whole, float | int) and whole:
                log.fraction, log.fraction_known = min(1.0, float(mine) / float(whole)), True
            if log.model == d.model:  # the parent was not known when the log began
                log.model = f"{parent.model} {d.model}"
        self._logs.move_to_end(key)
        return log

    def logs(self, since: float) -> Iterator[tuple[str, DeviceLog, list[MinuteUse]]]:
        """(uuid, log, its minutes starting at or after ``since``)."""
        for (_, uuid), log in self._logs.items():
            minutes = log.minutes(since)
            if minutes:
                yield uuid, log, minutes


def _profile_share(profile: str, gpu_model: str) -> float:
    """A MIG profile's share of its GPU from its compute slices ("3g.40gb" -> 3 of 7; an
    A30 has 4), for the minutes before its memory total is read."""
    head = profile.split("g.", 1)[0].split("+", maxsplit=1)[0]
    if not head.isdigit():
        return 1.0
    slices = 4 if "A30" in gpu_model else 7
    return min(1.0, int(head) / slices)
