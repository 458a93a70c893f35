"""``gpuscale idle``'s report and its arithmetic: from each device's time buckets (who held
it, its mean utilization) to GPU-hours allocated and used per namespace and workload, the
devices idle now, and what they cost. No I/O: the buckets come from the scaler's Usage
reply or from Prometheus matrices (idle_sources); price tables and durations are parsed
in idle_options.

Conventions, the same for both sources:

- a bucket counts for the part of it inside the window ``[now - window, now]``; a bucket
  that is absent (no data) counts for nothing: neither allocated, used nor idle;
- a device held by several pods in a bucket (a time-sliced GPU) is split evenly between
  them; a MIG instance counts as its ``fraction`` of a GPU;
- used = allocated x utilization; allocation in a bucket without a utilization reading is
  *unmeasured*: counted as allocated, not as used or idle (``coverage`` says how much);
- a price is per GPU-hour of a model; a MIG instance costs its fraction of its GPU's price
  (or its own model's price per instance-hour, when the table names it). Allocation of a
  model without a price is ``unpriced``, never costed at 0.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

# A MIG profile at the end of a model: "... 3g.40gb", "... 1g.10gb+me", "... 1c.3g.40gb".
MIG_PROFILE = re.compile(r"^(?P<gpu>.+) (?:\d+c\.)?(?P<slices>\d+)g\.\d+gb(?:\+[a-z]+)?$")
# An AMD partition's modes at the end of a model: "AMD Instinct MI300X cpx.nps1".
AMD_PARTITION = re.compile(r"^(?P<gpu>.+) (?P<mode>spx|dpx|tpx|qpx|cpx)\.nps\d$",
                           re.IGNORECASE)
# Partitions per mode on an MI300X (8 XCDs); an MI300A (6) or MI308X (4) in CPX has fewer:
# used only where no memory totals give the share (the agent exports them).
_PARTS = {"spx": 1, "dpx": 2, "tpx": 3, "qpx": 4, "cpx": 8}


def device_share(model: str) -> tuple[str, float] | None:
    """A MIG instance's or an AMD partition's GPU model and its share of that GPU by its
    profile (compute slices of 7; one of the mode's partitions); None for a whole GPU."""
    if m := MIG_PROFILE.match(model):
        return m.group("gpu"), min(1.0, int(m.group("slices")) / 7)
    if a := AMD_PARTITION.match(model):
        return a.group("gpu"), 1 / _PARTS[a.group("mode").lower()]
    return None


@dataclass(frozen=True, slots=True)
class Bucket:
    """One device over ``[start, start + width)`` (wall seconds)."""

    start: float
    width: float
    pods: tuple[str, ...] = ()  # "namespace/name" holding the device
    owners: tuple[str, ...] = ()  # each pod's workload "Kind/name" ("" unknown)
    utilization: float | None = None  # mean percent; None: no usable reading


@dataclass(frozen=True, slots=True)
class Device:
    node: str
    device: str  # a GPU's or MIG instance's UUID ("<GPU UUID>/<GPU_I_ID>" from Prometheus)
    model: str  # GPU name; MIG: "<GPU name> <profile>"
    fraction: float  # of a whole GPU (0 < fraction <= 1)
    buckets: tuple[Bucket, ...]  # oldest first; buckets without data are absent


@dataclass(frozen=True, slots=True)
class Usage:
    """GPU-hours of one namespace, workload, or all of them."""

    namespace: str = ""
    workload: str = ""  # "Kind/name"; "Pod/<name>" when the pod's owner is unknown
    allocated_h: float = 0.0
    measured_h: float = 0.0  # of allocated_h, with a utilization reading
    used_h: float = 0.0  # measured x utilization
    cost_allocated: float = 0.0  # of the priced part of allocated_h
    cost_idle: float = 0.0  # price x (measured - used), of the priced part
    unpriced_h: float = 0.0  # allocated GPU-hours of models without a price

    @property
    def idle_share(self) -> float | None:
        """The measured allocation left unused (0-1); None when nothing was measured."""
        return 1.0 - self.used_h / self.measured_h if self.measured_h > 0 else None

    @property
    def coverage(self) -> float | None:
        """The share of the allocation with a utilization reading; None: no allocation."""
        return self.measured_h / self.allocated_h if self.allocated_h > 0 else None

    @property
    def priced(self) -> bool:
        """Whether some of the allocation has a price (cost_* mean something)."""
        return self.allocated_h == 0 or self.unpriced_h < self.allocated_h * (1 - 1e-9)

    def plus(self, alloc: float, measured: float, used: float,
             rate: float | None) -> Usage:
        return Usage(self.namespace, self.workload, self.allocated_h + alloc,
                     self.measured_h + measured, self.used_h + used,
                     self.cost_allocated + (rate * alloc if rate is not None else 0.0),
                     self.cost_idle + (rate * (measured - used) if rate is not None else 0.0),
                     self.unpriced_h + (alloc if rate is None else 0.0))


@dataclass(frozen=True, slots=True)
class IdleDevice:
    """A device allocated now and under the threshold for at least ``idle_for``."""

    node: str
    device: str
    model: str
    fraction: float
    pods: tuple[str, ...]
    owners: tuple[str, ...]
    idle_s: float  # how long it has been idle (up to the history fetched)
    utilization: float  # mean percent over that time
    rate: float | None  # price per GPU-hour of this device (None: unpriced)


@dataclass(frozen=True, slots=True)
class Point:
    """The fleet (or namespace) in one bucket: GPUs held, used (held x utilization) and
    held with a utilization reading, over the bucket's time inside the window."""

    start: float
    allocated: float
    used: float
    measured: float


@dataclass(frozen=True, slots=True)
class Options:
    window_s: float = 3600.0
    threshold: float = 10.0  # percent: below is idle (the seed alert's `< 10`)
    idle_for_s: float = 600.0
    namespace: str = ""  # "": all
    prices: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AdvisoryPlan:
    """A workload planned beside the autoscaler that scales it (the scaler's advisory
    plans): its counts now (None: not known, ``why`` says why) and the GPU-hours planned
    and run over the last 24 h, in the seconds both were known."""

    namespace: str
    name: str
    planned: int | None
    actual: int | None
    planned_h: float
    actual_h: float
    known_s: float
    unknown_s: float
    why: str = ""

    @property
    def saved_h(self) -> float:
        """Run less planned GPU-hours (negative: the plan would have cost more)."""
        return self.actual_h - self.planned_h

    @property
    def coverage(self) -> float | None:
        total = self.known_s + self.unknown_s
        return self.known_s / total if total > 0 else None


@dataclass(frozen=True, slots=True)
class Report:
    now: float
    options: Options
    namespaces: tuple[Usage, ...]
    workloads: tuple[Usage, ...]
    total: Usage
    idle: tuple[IdleDevice, ...]
    timeline: tuple[Point, ...]
    devices: int  # devices seen in the window (of the namespace, when filtered)
    data_s: float  # device-seconds with data in the window
    unpriced_models: tuple[str, ...]
    advisory: tuple[AdvisoryPlan, ...] = ()  # from the scaler only

    @property
    def data_coverage(self) -> float | None:
        """Device-time with data over device-time in the window (devices x window)."""
        whole = self.devices * self.options.window_s
        return self.data_s / whole if whole > 0 else None


# -- the arithmetic -------------------------------------------------------------------------


def build_report(devices: Iterable[Device], now: float, options: Options) -> Report:
    """The report over ``[now - window_s, now]`` (buckets outside it are ignored, those
    inside before ``now - idle_for_s`` still count for how long a device has been idle)."""
    since = now - options.window_s
    ns_filter = options.namespace
    namespaces: dict[str, Usage] = {}
    workloads: dict[tuple[str, str], Usage] = {}
    total = Usage()
    idle: list[IdleDevice] = []
    timeline: dict[float, list[float]] = {}
    seen = 0
    data_s = 0.0
    unpriced: set[str] = set()
    for d in devices:
        rate = price_of(d.model, d.fraction, options.prices)
        mine = False
        for b in d.buckets:
            dt = max(0.0, min(b.start + b.width, now) - max(b.start, since))
            if dt <= 0:
                continue
            if not ns_filter or any(_ns(p) == ns_filter for p in b.pods):
                mine = True
                data_s += dt
            point = timeline.setdefault(b.start, [0.0, 0.0, 0.0])
            for pod, owner in zip(b.pods, _padded(b.owners, len(b.pods)), strict=True):
                ns = _ns(pod)
                if ns_filter and ns != ns_filter:
                    continue
                gpus = d.fraction / len(b.pods)
                alloc = gpus * dt / 3600.0
                measured = alloc if b.utilization is not None else 0.0
                used = measured * _clip(b.utilization) / 100.0
                if rate is None:
                    unpriced.add(d.model)
                workload = owner or f"Pod/{pod.partition('/')[2]}"
                namespaces[ns] = namespaces.get(ns, Usage(ns)).plus(alloc, measured, used, rate)
                key = (ns, workload)
                workloads[key] = workloads.get(key, Usage(ns, workload)).plus(
                    alloc, measured, used, rate)
                total = total.plus(alloc, measured, used, rate)
                point[0] += gpus
                point[1] += gpus * _clip(b.utilization) / 100.0
                point[2] += gpus if b.utilization is not None else 0.0
        if mine:
            seen += 1
        found = idle_now(d, now, options)
        if found is not None:
            idle.append(found)
    return Report(now, options, tuple(sorted(namespaces.values(), key=lambda u: u.namespace)),
                  tuple(sorted(workloads.values(), key=lambda u: (u.namespace, u.workload))),
                  total, tuple(sorted(idle, key=lambda i: (-i.idle_s, i.node, i.device))),
                  tuple(Point(s, *v) for s, v in sorted(timeline.items())), seen, data_s,
                  tuple(sorted(unpriced)))


def idle_now(d: Device, now: float, options: Options) -> IdleDevice | None:
    """``d`` when it is allocated now and every bucket back to at least ``idle_for_s`` ago
    is allocated, measured and under the threshold, with no gap between them. A bucket
    without data, unmeasured or unallocated ends the run: missing data is never idle."""
    if not d.buckets:
        return None
    last = d.buckets[-1]
    if last.start + 2 * last.width < now or not last.pods:
        return None  # not heard from in the current or the previous bucket: not "now"
    if options.namespace and not any(_ns(p) == options.namespace for p in last.pods):
        return None
    run: list[Bucket] = []
    for b in reversed(d.buckets):
        if run and abs(b.start + b.width - run[-1].start) > 1e-6:
            break  # a gap: minutes without data are never idle
        if not b.pods or b.utilization is None or not b.utilization < options.threshold:
            break
        run.append(b)
    if not run:
        return None
    idle_s = min(last.start + last.width, now) - run[-1].start
    if idle_s < options.idle_for_s:
        return None
    weighted = sum(_clip(b.utilization) * (min(b.start + b.width, now) - b.start)
                   for b in run)
    return IdleDevice(d.node, d.device, d.model, d.fraction, last.pods,
                      _padded(last.owners, len(last.pods)), idle_s,
                      weighted / idle_s if idle_s > 0 else 0.0,
                      price_of(d.model, d.fraction, options.prices))


def _ns(pod: str) -> str:
    return pod.partition("/")[0]


def _clip(util: float | None) -> float:
    return 0.0 if util is None else min(100.0, max(0.0, util))


def _padded(owners: tuple[str, ...], n: int) -> tuple[str, ...]:
    return (owners + ("",) * n)[:n]


# -- prices ---------------------------------------------------------------------------------


def price_of(model: str, fraction: float, prices: Mapping[str, float]) -> float | None:
    """Price per GPU-hour of a device of ``model`` (None: no price). A MIG instance or an
    AMD partition: its own model's price per instance-hour over its fraction, else its
    GPU's price."""
    if not prices:
        return None
    share = device_share(model)
    if share is None:
        return _lookup(model, prices)
    own = _lookup(model, prices)
    if own is not None:
        return own / fraction if fraction > 0 else None
    return _lookup(share[0], prices)


def _lookup(model: str, prices: Mapping[str, float]) -> float | None:
    if model in prices:
        return prices[model]
    folded = model.casefold()
    return next((v for k, v in prices.items() if k.casefold() == folded), None)
