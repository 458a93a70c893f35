"""``gpuscale idle``'s arithmetic: from each device's time buckets (who held it, its mean
utilization) to GPU-hours allocated and used per namespace and workload, the devices idle
now, and what they cost. No I/O: the buckets come from the scaler's Usage reply
(``devices_from_usage``) or from Prometheus matrices (``devices_from_matrices``).

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

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpuscale.common.errors import ConfigError
from gpuscale.proto import inspect_pb2 as pb

MAX_PRICES = 500
MAX_MODEL = 128
MAX_PRICE = 1_000_000.0
MAX_PRICE_TEXT = 20_000
# A MIG profile at the end of a model: "... 3g.40gb", "... 1g.10gb+me", "... 1c.3g.40gb".
_MIG_PROFILE = re.compile(r"^(?P<gpu>.+) (?:\d+c\.)?(?P<slices>\d+)g\.\d+gb(?:\+[a-z]+)?$")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


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


# -- the sources ----------------------------------------------------------------------------


def devices_from_usage(reply: pb.UsageReply) -> list[Device]:
    """The scaler's per-minute history as devices (utilization -1 or no samples: no
    reading)."""
    out = []
    for d in reply.devices:
        fraction = d.fraction if 0 < d.fraction <= 1 else 1.0
        out.append(Device(d.node, d.uuid, d.model, fraction, tuple(
            Bucket(m.start, reply.minute or 60.0, tuple(m.pods), tuple(m.owners),
                   m.utilization if m.samples > 0 and m.utilization >= 0 else None)
            for m in d.minutes)))
    return out


@dataclass(frozen=True, slots=True)
class Series:
    """One series of a Prometheus matrix: its labels and (time, value) points."""

    labels: Mapping[str, str]
    points: tuple[tuple[float, float], ...]


def holder(labels: Mapping[str, str]) -> str:
    """"namespace/pod" of the pod a device series is attributed to ("" none). A scrape
    that kept its own target labels renamed ours to exported_*: those win."""
    pod = labels.get("exported_pod") or labels.get("pod") or ""
    ns = labels.get("exported_namespace") or labels.get("namespace") or ""
    return f"{ns}/{pod}" if pod and ns else ""


def device_key(labels: Mapping[str, str]) -> tuple[str, str]:
    """(node, device) of a dcgm-style series: a MIG instance is its GPU's UUID and
    GPU_I_ID (its own UUID is not a label)."""
    gi = labels.get("GPU_I_ID", "")
    uuid = labels.get("UUID", "")
    return labels.get("Hostname", ""), f"{uuid}/{gi}" if gi else uuid


def devices_from_matrices(held: Sequence[Series], utilization: Sequence[Series],
                          memory: Sequence[Series], step: float,
                          owners: Mapping[str, str]) -> list[Device]:
    """Devices from range queries evaluated at the end of each ``step``-second bucket:
    ``held`` (any per-device series; a point with a holder's labels means that pod held the
    device in that bucket), ``utilization`` (percent, per device and holder), ``memory``
    (the MIG instances' and GPUs' memory totals, for a MIG instance's fraction); ``owners``
    maps "namespace/pod" to its workload "Kind/name"."""
    pods: dict[tuple[str, str], dict[float, set[str]]] = {}
    utils: dict[tuple[str, str], dict[float, list[float]]] = {}
    models: dict[tuple[str, str], str] = {}
    for s in (*held, *utilization):
        key = device_key(s.labels)
        if not key[1]:
            continue
        profile = s.labels.get("GPU_I_PROFILE", "")
        models.setdefault(key, f"{s.labels.get('modelName', '')} {profile}".strip())
        who = holder(s.labels)
        times = pods.setdefault(key, {})
        for t, _ in s.points:
            times.setdefault(t, set())
            if who:
                times[t].add(who)
    for s in utilization:
        key = device_key(s.labels)
        for t, v in s.points:
            if math.isfinite(v):
                utils.setdefault(key, {}).setdefault(t, []).append(v)
    fractions = _mig_fractions(memory)
    out = []
    for key, times in sorted(pods.items()):
        fraction = fractions.get(key) or _profile_fraction(models[key], key)
        buckets = []
        for t in sorted(times):
            held_by = tuple(sorted(times[t]))
            values = utils.get(key, {}).get(t)
            buckets.append(Bucket(t - step, step, held_by,
                                  tuple(owners.get(p, "") for p in held_by),
                                  sum(values) / len(values) if values else None))
        out.append(Device(key[0], key[1], models[key], fraction, tuple(buckets)))
    return out


def _mig_fractions(memory: Sequence[Series]) -> dict[tuple[str, str], float]:
    """(node, "<UUID>/<GI>") -> the instance's memory over its GPU's."""
    whole: dict[tuple[str, str], float] = {}
    parts: dict[tuple[str, str], float] = {}
    for s in memory:
        if not s.points:
            continue
        value = s.points[-1][1]
        key = device_key(s.labels)
        (parts if "/" in key[1] else whole)[key] = value
    out = {}
    for (node, dev), mine in parts.items():
        gpu = whole.get((node, dev.split("/")[0]))
        if gpu and math.isfinite(mine) and math.isfinite(gpu) and gpu > 0 and mine > 0:
            out[(node, dev)] = min(1.0, mine / gpu)
    return out


def _profile_fraction(model: str, key: tuple[str, str]) -> float:
    """A MIG instance without memory totals: its compute slices of 7; a GPU: 1."""
    m = _MIG_PROFILE.match(model)
    if "/" not in key[1] or m is None:
        return 1.0
    return min(1.0, int(m.group("slices")) / 7)


# -- prices and durations -------------------------------------------------------------------


def price_of(model: str, fraction: float, prices: Mapping[str, float]) -> float | None:
    """Price per GPU-hour of a device of ``model`` (None: no price). A MIG instance: its
    own model's price per instance-hour over its fraction, else its GPU's price."""
    if not prices:
        return None
    m = _MIG_PROFILE.match(model)
    if m is None:
        return _lookup(model, prices)
    own = _lookup(model, prices)
    if own is not None:
        return own / fraction if fraction > 0 else None
    return _lookup(m.group("gpu"), prices)


def _lookup(model: str, prices: Mapping[str, float]) -> float | None:
    if model in prices:
        return prices[model]
    folded = model.casefold()
    return next((v for k, v in prices.items() if k.casefold() == folded), None)


def parse_prices(text: str, what: str = "--price") -> dict[str, float]:
    """``"MODEL=PRICE,MODEL=PRICE"`` (price per GPU-hour; a model may contain "=" but not
    ","): the table, or ConfigError naming the item and what would be accepted."""
    if len(text) > MAX_PRICE_TEXT:
        raise ConfigError(f"{what}: longer than {MAX_PRICE_TEXT} characters; use --prices FILE")
    out: dict[str, float] = {}
    for i, item in enumerate(text.split(","), 1):
        if not item.strip():
            raise ConfigError(f"{what}: item {i} is empty (expected MODEL=PRICE, comma "
                              f"separated)")
        model, eq, price = item.rpartition("=")
        if not eq:
            raise ConfigError(f"{what}: item {i} {item[:40]!r} is not MODEL=PRICE")
        _add(out, model.strip(), price.strip(), f"{what}: item {i}")
    return out


def prices_from_mapping(data: object, what: str) -> dict[str, float]:
    """A price table read from YAML (a mapping of GPU model to price per GPU-hour)."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{what}: expected a mapping of GPU model to price per GPU-hour, "
                          f"e.g. 'NVIDIA H100 80GB HBM3: 2.50'")
    out: dict[str, float] = {}
    for model, price in data.items():
        if isinstance(price, bool) or not isinstance(price, int | float | str):
            raise ConfigError(f"{what}: {str(model)[:40]!r}: the price is not a number")
        _add(out, str(model).strip() if isinstance(model, str) else "", str(price).strip(),
             f"{what}: {str(model)[:40]!r}")
    return out


def _add(out: dict[str, float], model: str, price: str, where: str) -> None:
    if not model:
        raise ConfigError(f"{where}: no GPU model before the price")
    if len(model) > MAX_MODEL or not model.isprintable():
        raise ConfigError(f"{where}: the model is not a GPU name (printable, at most "
                          f"{MAX_MODEL} characters)")
    try:
        value = float(price)
    except ValueError:
        raise ConfigError(f"{where}: {price[:20]!r} is not a price (a number per "
                          f"GPU-hour)") from None
    if not (math.isfinite(value) and 0 <= value <= MAX_PRICE):
        raise ConfigError(f"{where}: the price must be 0 to {MAX_PRICE:g} per GPU-hour")
    if model in out:
        raise ConfigError(f"{where}: {model[:40]!r} is priced twice")
    if len(out) >= MAX_PRICES:
        raise ConfigError(f"{where}: more than {MAX_PRICES} prices")
    out[model] = value


def parse_duration(text: str, what: str) -> float:
    """"90", "90s", "10m", "1.5h", "2d" -> seconds (> 0), or ConfigError."""
    m = _DURATION.match(text[:40])
    if m is None or len(text) > 40:
        raise ConfigError(f"{what}: {text[:40]!r} is not a duration (e.g. 90s, 10m, 1h, 2d)")
    value = float(m.group(1)) * _UNIT_S[m.group(2) or "s"]
    if not 0 < value <= 400 * 86400:
        raise ConfigError(f"{what}: {text[:40]!r} must be above 0 and at most 400 days")
    return value
