"""The autoscaling setups people run for LLM serving, each from its documented defaults,
as ``run_policy`` arguments: what gpuscale is compared against.

Sources (read at the commits named; a default quoted here sits next to its constant):

- Kubernetes HPA and KEDA: ``hpa.py`` and ``keda.py`` (HPA sync 15 s, KEDA polling 30 s).
- dcgm-exporter (NVIDIA/dcgm-exporter d5e5f510): pkg/cmd/app.go, ``--collect-interval``
  / ``-c`` default 30000 ms; deployment/values.yaml, ServiceMonitor ``interval: 15s``.
- vLLM production-stack docs/source/use_cases/autoscaling-keda.rst: a KEDA ``prometheus``
  trigger on ``vllm:num_requests_waiting``, ``threshold: '5'``.
- Knative Serving (knative/serving 98e5ef90): config/core/configmaps/autoscaler.yaml and
  pkg/autoscaler/scaling/autoscaler.go (``Scale``), pkg/autoscaler/scaling/multiscaler.go
  (``tickInterval``), pkg/autoscaler/metrics/collector.go (``scrapeTickInterval``).
- AIBrix (vllm-project/aibrix, release v0.4.1): pkg/controller/podautoscaler/scaler/kpa.go,
  scaler/apa.go, common/context.go, podautoscaler_controller.go; samples/autoscaling/
  kpa.yaml and apa.yaml (``targetMetric: gpu_cache_usage_perc``, ``targetValue: '0.5'``).
- llm-d workload-variant-autoscaler (b08b1c77): internal/config/loader.go
  (``GLOBAL_OPT_INTERVAL`` 60s), pkg/analyzer (a queueing model of each variant),
  internal/collector/registration/saturation.go (token means over ``[5m]``).

How ``run_policy``'s loop reads an HPA-based policy: KEDA polls every 30 s
(``ScaledObjectSpec.polling_s``; it only matters for 0 <-> 1), and the HPA syncs every 15 s,
reading the signal afresh each time, as KEDA's metrics server queries its scaler on every
HPA request. Staleness from Prometheus is therefore modelled in the signal (``Delayed``).
The production-stack example's ``pollingInterval: 15`` cannot be set through
``run_policy``; above zero replicas it changes nothing.

Every policy sees only what a real one can: per-replica telemetry (``signals``), the
engine's counters (requests finished, running, waiting), never future arrivals.

The stateful parts (``Delayed``, the deciders) belong to one run: ``baselines`` makes
fresh ones on each call, and each resets itself if time goes backwards (a new run).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from gpuscale.models.hpa import Metric, MetricSource, TargetType
from gpuscale.models.serving import ReplicaSignals, ServingModel, ServingParams
from gpuscale.models.slo import SLO_TTFT_S
from gpuscale.sim.scaler_adapter import profile_signal
from gpuscale.sim.simulate import Signal, cpu_signal, node_max_signal

# --- Staleness: a sampled, delayed pipeline --------------------------------------------


class Delayed:
    """A signal as seen through a sampling pipeline (exporter -> Prometheus -> adapter).

    The inner signal is sampled at ``phase_s + k * sample_every_s`` (at the first step at
    or after each point: call ``observe`` every step, as ``run_policy``'s decider hook
    does); a read at ``now`` returns the sample from the last point at or before
    ``now - delay_s``. The first read or observation also stands for the points before
    it, and is the answer until a sample is old enough (a window that opens on a running
    system, the same before as at its start). Pods metrics are matched to the pods ready
    now by index (replicas are created and removed newest-last, so index i is one pod): a
    pod ready now but not sampled then has no value (the HPA's missing-pod rule), and
    unready pods are counted as they are now.
    """

    def __init__(self, signal: Signal, sample_every_s: float, delay_s: float,
                 phase_s: float = 0.0) -> None:
        if sample_every_s <= 0 or delay_s < 0:
            raise ValueError("sample_every_s must be > 0 and delay_s >= 0")
        self.signal = signal
        self.every, self.delay, self.phase = sample_every_s, delay_s, phase_s
        self._samples: list[tuple[float, list[Metric]]] = []  # (sample point, metrics)
        self._last = -math.inf

    def observe(self, model: ServingModel, now: float, replicas: int = 0) -> None:
        """Take the sample due at ``now``, if any (a ``Decider`` that never decides)."""
        if now < self._last:
            self._samples.clear()
        self._last = now
        k = math.floor((now - self.phase) / self.every)
        point = self.phase + k * self.every
        if not self._samples or self._samples[-1][0] < point:
            self._samples.append((point, self.signal(model, now)))
            # Keep what a read at now or later may still need.
            while len(self._samples) > 1 and self._samples[1][0] <= now - self.delay:
                self._samples.pop(0)

    def __call__(self, model: ServingModel, now: float) -> list[Metric]:
        if not self._samples or self._last != now:
            self.observe(model, now)  # called without the hook: sample when read
        seen = [m for t, m in self._samples if t <= now - self.delay]
        metrics = seen[-1] if seen else self._samples[0][1]
        sig = model.signals(now)
        ready = sum(1 for s in sig if s.ready)
        return [_rematch(m, ready, len(sig) - ready) for m in metrics]


def _rematch(m: Metric, ready: int, unready: int) -> Metric:
    if m.kind is not MetricSource.PODS:
        return m
    values = (m.pod_values + (None,) * ready)[:ready]
    return replace(m, pod_values=values or (None,), unready_pods=unready)


# --- Signals behind Prometheus ----------------------------------------------------------

DCGM_COLLECT_S = 30.0  # dcgm-exporter pkg/cmd/app.go: --collect-interval default 30000 ms
SCRAPE_S = 15.0  # dcgm-exporter deployment/values.yaml: serviceMonitor.interval 15s
GPU_UTIL_TARGET = 70.0  # chosen, not a default: the target node_max_signal and cpu_signal
#   use, so the GPU policies differ only in their pipeline
VLLM_WAITING_THRESHOLD = 5.0  # vLLM production-stack autoscaling-keda.rst: threshold '5'


def dcgm_gpu_util_signal(model: ServingModel, now: float) -> list[Metric]:
    """DCGM_FI_DEV_GPU_UTIL per pod (one GPU each), read by prometheus-adapter with the
    common instant-query rule ``avg(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)``
    as a Pods metric, AverageValue ``GPU_UTIL_TARGET`` - undelayed; see ``dcgm_hpa``."""
    sig = model.signals(now)
    values = tuple(s.duty_cycle for s in sig if s.ready)
    return [Metric(MetricSource.PODS, TargetType.AVERAGE_VALUE, GPU_UTIL_TARGET,
                   pod_values=values or (None,),
                   unready_pods=sum(1 for s in sig if not s.ready))]


def vllm_waiting_signal(model: ServingModel, now: float) -> list[Metric]:
    """KEDA's prometheus scaler on ``sum(vllm:num_requests_waiting)`` (the scaler needs one
    series, hence the sum over pods), AverageValue ``VLLM_WAITING_THRESHOLD``."""
    waiting = sum(s.waiting for s in model.signals(now) if s.ready)
    return [Metric(MetricSource.EXTERNAL, TargetType.AVERAGE_VALUE, VLLM_WAITING_THRESHOLD,
                   float(waiting))]


def dcgm_hpa() -> Delayed:
    """dcgm-exporter -> Prometheus -> prometheus-adapter -> HPA: a reading is the last
    30 s collection that a 15 s scrape has picked up. Sampling every 30 s, read 15 s late:
    at the HPA's 15 s syncs the value is 15 or 30 s old (mean 22.5 s: a uniform collection
    phase, mean 15 s, plus the scrape's, mean 7.5 s)."""
    return Delayed(dcgm_gpu_util_signal, DCGM_COLLECT_S, delay_s=SCRAPE_S)


def prometheus_scraped(signal: Signal) -> Delayed:
    """A signal the HPA reads from Prometheus, scraped every 15 s and queried when read
    (KEDA's metrics server queries its scaler on every HPA request; prometheus-adapter
    queries on every request too). The scrape's phase is set off the HPA's syncs by 7 s, so
    a read sees a sample 8 s old: about the mean of a uniform phase (7.5 s)."""
    return Delayed(signal, SCRAPE_S, delay_s=0.0, phase_s=7.0)


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


def aibrix_kpa() -> Kpa:
    """AIBrix's KPA (v0.4.1, a port of Knative's ``Scale``) with its own defaults,
    on gpu_cache_usage_perc: scaler/kpa.go NewKpaScalingContext: StableWindow 60 s,
    PanicWindow 10 s, PanicThreshold 2.0, ScaleDownDelay 30 min; common/context.go:
    MaxScaleUpRate 2, MaxScaleDownRate 2; metrics fetched each 10 s resync.

    Releases v0.5.0 to v0.7.0 changed this: stable/panic windows 180/60 s
    (metrics/client.go), panic when panic mean / stable mean > 2 with no hold, a 300 s
    scale-down cooldown, and the window holds the pods' *mean* while the desired count is
    still ceil(value / target) (algorithm/kpa.go) - per pod over per pod, which caps the
    count near ceil(100 % / target). We model v0.4.1, whose sum matches Knative's and the
    algorithm's own unit tests."""
    return Kpa(KpaSpec(target=KV_TARGET, stable_s=60.0, panic_s=10.0, panic_threshold=2.0,
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


# --- A queueing-model autoscaler (llm-d workload-variant-autoscaler's kind) -------------

WVA_INTERVAL_S = 60.0  # internal/config/loader.go: GLOBAL_OPT_INTERVAL default "60s"
TOKEN_WINDOW_S = 300.0  # saturation.go: rate(vllm:request_*_tokens_sum[5m]) / _count[5m]


def mm1_replicas(rate: float, service_s: float, wait_budget_s: float,
                 limit: int = 100_000) -> int | None:
    """The fewest replicas n, each an M/M/1 queue fed rate / n, whose mean wait in queue
    Wq = rho x service_s / (1 - rho) (rho = rate x service_s / n < 1) is within
    ``wait_budget_s``. 0 with no arrivals; None if no n up to ``limit`` will do (a budget
    of zero or less)."""
    if rate <= 0:
        return 0
    if wait_budget_s <= 0:
        return None
    for n in range(1, limit + 1):
        rho = rate * service_s / n
        if rho < 1 and rho * service_s / (1 - rho) <= wait_budget_s:
            return n
    return None


class QueueModel:
    """A ``Decider`` sizing the fleet from a queueing model every ``interval_s``.

    Arrival rate over the last interval = (requests finished + growth of the requests in
    the system, waiting or running) / interval: what the engine's counters give. Mean
    prompt and output tokens: of the requests finished in the last ``TOKEN_WINDOW_S``. A
    request's service time is its cost to a replica at full batch from the performance
    profile (``ServingParams``: prompt / prefill_tps + output / decode_tps_max, WVA's
    offline benchmark); its prefill, prompt / prefill_tps. Replicas: ``mm1_replicas`` with
    the SLO minus the prefill as the budget for waiting. No finished request yet, or an
    SLO the prefill alone misses: no decision."""

    def __init__(self, params: ServingParams, slo_s: float = SLO_TTFT_S,
                 interval_s: float = WVA_INTERVAL_S) -> None:
        self.p, self.slo, self.interval = params, slo_s, interval_s
        self._last: tuple[float, int, int] | None = None  # (time, finished, in system)
        self._marks: deque[tuple[float, int]] = deque()  # (time, finished) per evaluation
        self.rate = 0.0

    def __call__(self, model: ServingModel, now: float, current: int) -> int | None:
        if self._last is not None and now < self._last[0]:
            self._last = None
            self._marks.clear()
        finished = len(model.done)
        in_system = len(model.queue) + sum(len(r.running)
                                           for r in model.replicas + model.draining)
        if self._last is None:
            self._last = (now, finished, in_system)
            self._marks.append((now, finished))
            return None
        t0, done0, sys0 = self._last
        if now - t0 < self.interval:
            return None
        self._last = (now, finished, in_system)
        self.rate = max(0.0, (finished - done0 + in_system - sys0) / (now - t0))
        while len(self._marks) > 1 and self._marks[1][0] <= now - TOKEN_WINDOW_S:
            self._marks.popleft()
        recent = model.done[self._marks[0][1]:]  # finished since about TOKEN_WINDOW_S ago
        self._marks.append((now, finished))
        if not recent:
            return None
        prompt = sum(r.prompt for r in recent) / len(recent)
        output = sum(r.output for r in recent) / len(recent)
        prefill = prompt / self.p.prefill_tps
        service = prefill + output / self.p.decode_tps_max
        return mm1_replicas(self.rate, service, self.slo - prefill)


# --- The registry ---------------------------------------------------------------------


def baselines(params: ServingParams, peak: int | None = None, min_replicas: int = 1,
              start: int | None = None) -> list[tuple[str, dict[str, Any]]]:
    """(name, ``run_policy`` keyword arguments) for every policy, made fresh: run each
    once. ``peak``: the static policy's count (left out when None: it needs the trace's
    peak, e.g. the oracle's); ``start``: the replicas running when the window opens."""
    common: dict[str, Any] = {"min_replicas": min_replicas}
    if start is not None:
        common["start"] = start
    dcgm = dcgm_hpa()
    waiting = prometheus_scraped(vllm_waiting_signal)
    scraped = prometheus_scraped(profile_signal({"profile": "vllm-inference"}))
    out: list[tuple[str, dict[str, Any]]] = [
        ("gpuscale vllm-inference", {"signal": profile_signal({"profile": "vllm-inference"})}),
        ("gpuscale vllm-inference via Prometheus",
         {"signal": scraped, "decider": _observer(scraped)}),
        ("node-max GPU util (AverageValue)", {"signal": node_max_signal}),
        ("CPU-based HPA", {"signal": cpu_signal}),
        ("DCGM GPU util HPA", {"signal": dcgm, "decider": _observer(dcgm)}),
        ("KEDA prometheus vllm waiting", {"signal": waiting, "decider": _observer(waiting)}),
        ("Knative KPA", {"decider": knative_kpa()}),
        ("AIBrix KPA", {"decider": aibrix_kpa()}),
        ("AIBrix APA", {"decider": Apa()}),
        ("queue model (WVA-like)", {"decider": QueueModel(params)}),
    ]
    out = [(name, {**common, **kw}) for name, kw in out]
    if peak is not None:
        out.append((f"static at peak ({peak})", {"static": peak}))
    return out


def _observer(delayed: Delayed) -> Callable[[ServingModel, float, int], int | None]:
    def observe(model: ServingModel, now: float, replicas: int) -> int | None:
        delayed.observe(model, now)
        return None  # leave the decision to the HPA
    return observe
