"""The autoscaling setups people run for LLM serving, each from its documented defaults,
as ``run_policy`` arguments: what gpuscale is compared against.

Each family is modelled in its own module, with the sources it was read from:
``prometheus_hpa`` (HPA-based policies behind Prometheus: dcgm-exporter, KEDA's prometheus
scaler), ``window_autoscalers`` (Knative's KPA, AIBrix's KPA and APA) and ``queue_model``
(llm-d workload-variant-autoscaler's kind).

Every policy sees only what a real one can: per-replica telemetry (``signals``), the
engine's counters (requests finished, running, waiting), never future arrivals.

The stateful parts (``Delayed``, the deciders) belong to one run: ``baselines`` makes
fresh ones on each call, and each resets itself if time goes backwards (a new run).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuscale.models.serving import ServingModel, ServingParams
from gpuscale.sim.prometheus_hpa import (
    Delayed,
    dcgm_hpa,
    prometheus_scraped,
    vllm_waiting_signal,
)
from gpuscale.sim.queue_model import QueueModel
from gpuscale.sim.scaler_adapter import profile_signal
from gpuscale.sim.simulate import cpu_signal, node_max_signal
from gpuscale.sim.window_autoscalers import Apa, aibrix_kpa, knative_kpa


def baselines(params: ServingParams, peak: int | None = None, min_replicas: int = 1,
              start: int | None = None) -> list[tuple[str, dict[str, Any]]]:
    """(name, ``run_policy`` keyword arguments) for every policy, made fresh: run each
    once. ``peak``: the static policy's count (left out when None: it needs the trace's
    peak, e.g. ``sim.compare.static_peak``'s); ``start``: the replicas running when the
    window opens."""
    common: dict[str, Any] = {"min_replicas": min_replicas}
    # A ScaledObject or HPA as documented sets no behavior: KEDA passes none and the HPA
    # uses its own limits (at most max(2 x current, 4) per sync; models.hpa).
    plain: dict[str, Any] = {"scale_down": None}
    if start is not None:
        common["start"] = start
    dcgm = dcgm_hpa()
    waiting = prometheus_scraped(vllm_waiting_signal)
    scraped = prometheus_scraped(profile_signal({"profile": "vllm-inference"}))
    out: list[tuple[str, dict[str, Any]]] = [
        ("gpuscale vllm-inference",
         {"signal": profile_signal({"profile": "vllm-inference"}, min_replicas)}),
        ("gpuscale vllm-inference via Prometheus",
         {"signal": scraped, "decider": _observer(scraped)}),
        ("node-max GPU util (AverageValue)", {"signal": node_max_signal, **plain}),
        ("CPU-based HPA", {"signal": cpu_signal, **plain}),
        ("DCGM GPU util HPA", {"signal": dcgm, "decider": _observer(dcgm), **plain}),
        ("KEDA prometheus vllm waiting",
         {"signal": waiting, "decider": _observer(waiting), **plain}),
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
