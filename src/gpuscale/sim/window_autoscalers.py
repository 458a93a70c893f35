"""Autoscalers that decide on window averages of a metric: Knative Serving's KPA, and
AIBrix's KPA (its port) and APA, each a ``Decider`` for ``run_policy``.

Sources (read at the commits named; a default quoted here sits next to its constant):

- Knative Serving (knative/serving 98e5ef90): config/core/configmaps/autoscaler.yaml and
  pkg/autoscaler/scaling/autoscaler.go (``Scale``), pkg/autoscaler/scaling/multiscaler.go
  (``tickInterval``), pkg/autoscaler/metrics/collector.go (``scrapeTickInterval``).
- AIBrix (vllm-project/aibrix, release v0.4.1): pkg/controller/podautoscaler/scaler/kpa.go,
  scaler/apa.go, common/context.go, podautoscaler_controller.go; samples/autoscaling/
  kpa.yaml and apa.yaml (``targetMetric: gpu_cache_usage_perc``, ``targetValue: '0.5'``).

Each decider belongs to one run and resets itself if time goes backwards (a new run).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from gpuscale.models.serving import ReplicaSignals, ServingModel

# --- Window averages, as Knative and AIBrix keep them ------------------------------------


class _Window:
    """Recorded values over the last ``length_s``; the mean of what is in the window (the
    buckets Knative's TimedFloat64Buckets and AIBrix's TimeWindow average)."""

    def __init__(self, length_s: float) -> None:
        self.length = length_s
        self._values: deque[tuple[float, float]] = deque()

    def record(self, now: float, value: float) -> None:
        self._values.append((now, value))
        while self._values and self._values[0][0] <= now - self.length:
            self._values.popleft()

    def mean(self) -> float:
        return sum(v for _, v in self._values) / len(self._values) if self._values else 0.0

    def max(self) -> float:
        return max((v for _, v in self._values), default=0.0)


def _ready(model: ServingModel, now: float) -> list[ReplicaSignals]:
    return [s for s in model.signals(now) if s.ready]


# --- Knative's KPA and AIBrix's KPA (its port) -------------------------------------------


@dataclass(frozen=True, slots=True)
class KpaSpec:
    """The decider's settings; the defaults are Knative Serving's config-autoscaler."""

    target: float = 100.0 * 0.70  # container-concurrency-target-default "100" x
    #   container-concurrency-target-percentage "70"
    stable_s: float = 60.0  # stable-window "60s"
    panic_s: float = 6.0  # panic-window-percentage "10.0" of the stable window
    panic_threshold: float = 2.0  # panic-threshold-percentage "200.0"
    max_up_rate: float = 1000.0  # max-scale-up-rate "1000.0"
    max_down_rate: float = 2.0  # max-scale-down-rate "2.0"
    scale_down_delay_s: float = 0.0  # scale-down-delay "0s"
    to_zero_grace_s: float = 30.0  # scale-to-zero-grace-period "30s"
    tick_s: float = 2.0  # multiscaler.go: tickInterval = 2 * time.Second
    collect_s: float = 1.0  # collector.go: scrapeTickInterval = time.Second


def concurrency(model: ServingModel, now: float) -> float:
    """Requests in the revision: running on ready pods plus waiting (Knative's queue-proxy
    and activator count both)."""
    return float(sum(s.running for s in _ready(model, now)) + len(model.queue))


class Kpa:
    """A KPA decider (``Decider``), after Knative's ``autoscaler.Scale``: every tick,
    desired = ceil(window mean of the total metric / target) for the stable and the panic
    window, each held within [floor(ready / max_down_rate), ceil(ready x max_up_rate)].
    Panic starts when the panic window's count is ``panic_threshold`` x the ready pods or
    more, and ends a stable window after the last tick over it; in panic the count never
    goes down (the largest panic count so far). Like a freshly started autoscaler it opens
    in panic when more than one pod is ready (no history yet to scale down on). A scale
    down waits for ``scale_down_delay_s`` (the largest count in that window), and a scale
    to zero for ``to_zero_grace_s`` of wanting zero.

    ``metric``: the total over the ready pods (Knative: concurrency)."""

    def __init__(self, spec: KpaSpec = KpaSpec(),
                 metric: Callable[[ServingModel, float], float] = concurrency) -> None:
        self.spec, self.metric = spec, metric
        self._reset()

    def _reset(self) -> None:
        s = self.spec
        self._stable, self._panic = _Window(s.stable_s), _Window(s.panic_s)
        self._delay = _Window(s.scale_down_delay_s)
        self._last_collect = self._last_tick = -math.inf
        self._panic_since: float | None = None  # last tick over the threshold
        self._max_panic = 0
        self._zero_since: float | None = None
        self._started = False
        self.panicking = False

    def __call__(self, model: ServingModel, now: float, current: int) -> int | None:
        s = self.spec
        if now < self._last_collect:
            self._reset()
        if now - self._last_collect >= s.collect_s:
            self._last_collect = now
            value = self.metric(model, now)
            self._stable.record(now, value)
            self._panic.record(now, value)
        ready_n = len(_ready(model, now))
        if not self._started:
            self._started = True
            if ready_n > 1:  # autoscaler.go New(): "We always start in the panic mode"
                self._panic_since, self._max_panic = now, ready_n
        if now - self._last_tick < s.tick_s:
            return None
        self._last_tick = now
        ready = max(1.0, float(ready_n))
        up, down = math.ceil(s.max_up_rate * ready), math.floor(ready / s.max_down_rate)
        dspc = math.ceil(self._stable.mean() / s.target)
        dppc = math.ceil(self._panic.mean() / s.target)
        stable_n = int(min(max(dspc, down), up))
        panic_n = int(min(max(dppc, down), up))
        over = dppc / ready >= s.panic_threshold
        if over:
            self._panic_since = now
        elif self._panic_since is not None and now - self._panic_since > s.stable_s:
            self._panic_since, self._max_panic = None, 0
        desired = stable_n
        self.panicking = self._panic_since is not None
        if self.panicking:
            self._max_panic = max(self._max_panic, stable_n, panic_n)
            desired = self._max_panic
        if s.scale_down_delay_s > 0:
            self._delay.record(now, float(desired))
            desired = int(self._delay.max())
        if desired == 0 and current > 0:  # to zero only after the grace period
            self._zero_since = now if self._zero_since is None else self._zero_since
            if now - self._zero_since < s.to_zero_grace_s:
                return current
        else:
            self._zero_since = None
        return desired


def knative_kpa() -> Kpa:
    """Knative's KPA with config-autoscaler's defaults, on concurrency."""
    return Kpa()


KV_TARGET = 50.0  # AIBrix samples/autoscaling/kpa.yaml and apa.yaml:
#   targetMetric gpu_cache_usage_perc, targetValue '0.5' (our kv_cache is in percent)
AIBRIX_SYNC_S = 10.0  # podautoscaler_controller.go: resyncInterval 10 * time.Second


def kv_cache_total(model: ServingModel, now: float) -> float:
    """gpu_cache_usage_perc summed over the ready pods (AIBrix v0.4.1 KPAMetricsClient
    .UpdateMetrics sums the pods' values), in percent."""
    return sum(s.kv_cache for s in _ready(model, now))


def aibrix_kpa(target: float = KV_TARGET) -> Kpa:
    """AIBrix's KPA (v0.4.1, a port of Knative's ``Scale``) with its own defaults,
    on gpu_cache_usage_perc: scaler/kpa.go NewKpaScalingContext: StableWindow 60 s,
    PanicWindow 10 s, PanicThreshold 2.0, ScaleDownDelay 30 min; common/context.go:
    MaxScaleUpRate 2, MaxScaleDownRate 2; metrics fetched each 10 s resync.

    Releases v0.5.0 to v0.7.0 changed this: stable/panic windows 180/60 s
    (metrics/client.go), panic when panic mean / stable mean > 2 with no hold, a 300 s
    scale-down cooldown, and the window holds the pods' *mean* while the desired count is
    still ceil(value / target) (algorithm/kpa.go) - per pod over per pod, which caps the
    count near ceil(100 % / target). We model v0.4.1, whose sum matches Knative's and the
    algorithm's own unit tests. ``target``: its targetValue, in percent (``gpuscale simulate
    --sweep`` moves it)."""
    return Kpa(KpaSpec(target=target, stable_s=60.0, panic_s=10.0, panic_threshold=2.0,
                       max_up_rate=2.0, max_down_rate=2.0, scale_down_delay_s=30 * 60.0,
                       to_zero_grace_s=0.0, tick_s=AIBRIX_SYNC_S, collect_s=AIBRIX_SYNC_S),
               kv_cache_total)


@dataclass(frozen=True, slots=True)
class ApaSpec:
    """AIBrix v0.4.1 scaler/apa.go NewApaScalingContext and common/context.go."""

    target: float = KV_TARGET
    up_tolerance: float = 0.1  # UpFluctuationTolerance 0.1
    down_tolerance: float = 0.2  # DownFluctuationTolerance 0.2
    window_s: float = 60.0  # Window time.Second * 60
    max_up_rate: float = 2.0  # MaxScaleUpRate 2
    max_down_rate: float = 2.0  # MaxScaleDownRate 2
    sync_s: float = AIBRIX_SYNC_S


class Apa:
    """AIBrix's APA (``Decider``): every sync, use per pod = window mean of the pods' total
    / ready pods; r = use / target. Above 1 + up_tolerance: min(ceil(n x r),
    ceil(n x max_up_rate)); below 1 - down_tolerance: max(ceil(n x r),
    floor(n / max_down_rate)); otherwise n (n: ready pods; none ready: no decision)."""

    def __init__(self, spec: ApaSpec = ApaSpec(),
                 metric: Callable[[ServingModel, float], float] = kv_cache_total) -> None:
        self.spec, self.metric = spec, metric
        self._window = _Window(spec.window_s)
        self._last = -math.inf

    def __call__(self, model: ServingModel, now: float, current: int) -> int | None:
        s = self.spec
        if now < self._last:
            self._window, self._last = _Window(s.window_s), -math.inf
        if now - self._last < s.sync_s:
            return None
        self._last = now
        self._window.record(now, self.metric(model, now))
        n = len(_ready(model, now))
        if n == 0:
            return None  # apa.go: "Unexpected pod count": no result
        return apa_replicas(n, self._window.mean() / n, s)


def apa_replicas(n: int, use_per_pod: float, spec: ApaSpec = ApaSpec()) -> int:
    """apa.go ComputeTargetReplicas for ``n`` pods at ``use_per_pod``."""
    r = use_per_pod / spec.target
    if r > 1 + spec.up_tolerance:
        return min(math.ceil(n * r), math.ceil(spec.max_up_rate * n))
    if r < 1 - spec.down_tolerance:
        return max(math.ceil(n * r), math.floor(n / spec.max_down_rate))
    return n
