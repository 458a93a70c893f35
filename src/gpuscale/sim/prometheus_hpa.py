"""HPA-based policies whose signal reaches the HPA through Prometheus: dcgm-exporter's GPU
utilization behind prometheus-adapter, and KEDA's prometheus scaler on vLLM's queue - with
the staleness of the sampling pipeline between the engine and the HPA (``Delayed``).

Sources (read at the commits named; a default quoted here sits next to its constant):

- Kubernetes HPA and KEDA: ``hpa.py`` and ``keda.py`` (HPA sync 15 s, KEDA polling 30 s).
- dcgm-exporter (NVIDIA/dcgm-exporter d5e5f510): pkg/cmd/app.go, ``--collect-interval``
  / ``-c`` default 30000 ms; deployment/values.yaml, ServiceMonitor ``interval: 15s``.
- vLLM production-stack docs/source/use_cases/autoscaling-keda.rst: a KEDA ``prometheus``
  trigger on ``vllm:num_requests_waiting``, ``threshold: '5'``.

How ``run_policy``'s loop reads an HPA-based policy: KEDA polls every 30 s
(``ScaledObjectSpec.polling_s``; it only matters for 0 <-> 1), and the HPA syncs every 15 s,
reading the signal afresh each time, as KEDA's metrics server queries its scaler on every
HPA request. Staleness from Prometheus is therefore modelled in the signal (``Delayed``).
The production-stack example's ``pollingInterval: 15`` cannot be set through
``run_policy``; above zero replicas it changes nothing.
"""

from __future__ import annotations

import math
from dataclasses import replace

from gpuscale.models.hpa import Metric, MetricSource, TargetType
from gpuscale.models.serving import ServingModel
from gpuscale.sim.simulate import Signal

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
