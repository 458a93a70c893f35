"""The baseline policies, each checked on inputs whose answer is worked out by hand."""

from __future__ import annotations

import pytest

from gpuscale.models.hpa import Metric, MetricSource, TargetType
from gpuscale.models.serving import InFlightRequest, ServingModel, ServingParams
from gpuscale.sim.baselines import baselines
from gpuscale.sim.prometheus_hpa import Delayed
from gpuscale.sim.queue_model import QueueModel, mm1_replicas
from gpuscale.sim.simulate import run_policy
from gpuscale.sim.window_autoscalers import Apa, ApaSpec, Kpa, KpaSpec, apa_replicas
from gpuscale.traffic.patterns import synthetic


def clock_signal(model: ServingModel, now: float) -> list[Metric]:
    """A signal whose value is the time it was read at."""
    return [Metric(MetricSource.EXTERNAL, TargetType.AVERAGE_VALUE, 1.0, now)]


def warm(n: int) -> ServingModel:
    model = ServingModel(ServingParams())
    model.set_replicas(n, 0.0, warm=True)
    return model


@pytest.mark.parametrize(("every", "delay", "phase", "reads"), [
    (1.0, 10.0, 0.0, {10.0: 0.0, 25.0: 15.0, 99.0: 89.0}),  # exactly delay_s ago
    # dcgm-exporter every 30 s, a 15 s scrape: at 44 s the 30 s sample is only 14 s old.
    (30.0, 15.0, 0.0, {44.0: 0.0, 45.0: 30.0, 74.0: 30.0, 75.0: 60.0}),
    (15.0, 0.0, 7.0, {15.0: 7.0, 21.0: 7.0, 22.0: 22.0, 30.0: 22.0}),  # scrape off-phase
    (30.0, 15.0, 0.0, {5.0: 0.0}),  # nothing old enough yet: the first sample
])
def test_delayed_reads_the_last_sample_at_least_delay_old(
        every: float, delay: float, phase: float, reads: dict[float, float]) -> None:
    model = ServingModel()
    delayed = Delayed(clock_signal, every, delay, phase)
    for t in range(int(max(reads)) + 1):
        delayed.observe(model, float(t))
        if float(t) in reads:
            assert delayed(model, float(t))[0].value == reads[float(t)], t


def test_delayed_matches_sampled_pod_values_to_the_pods_ready_now() -> None:
    model = warm(2)

    def duty(m: ServingModel, now: float) -> list[Metric]:
        return [Metric(MetricSource.PODS, TargetType.AVERAGE_VALUE, 70.0,
                       pod_values=tuple(10.0 * (i + 1) for i, s in
                                        enumerate(m.signals(now)) if s.ready))]

    delayed = Delayed(duty, 30.0, 15.0)
    delayed.observe(model, 0.0)
    model.set_replicas(3, 0.0, warm=True)  # a third pod, ready after the sample
    model.set_replicas(4, 0.0)  # and a fourth, still starting
    got = delayed(model, 20.0)[0]
    assert (got.pod_values, got.unready_pods) == ((10.0, 20.0, None), 1)
    model.set_replicas(1, 20.0)  # the newest go first
    assert delayed(model, 20.0)[0].pod_values == (10.0,)


def test_delayed_starts_over_when_time_goes_back() -> None:
    model = ServingModel()
    delayed = Delayed(clock_signal, 10.0, 0.0)
    for t in range(0, 60):
        delayed.observe(model, float(t))
    assert delayed(model, 5.0)[0].value == 5.0  # a new run: sampled afresh


def test_knative_kpa_panics_on_a_3x_step_and_holds_until_a_stable_window_passes() -> None:
    """One ready pod at its target (70 requests: 100 x 70 %), then three times that from
    100 s. The 6 s panic window (95-100 s) averages (5 x 70 + 210) / 6 = 93.3: 2 pods,
    2 / 1 ready >= 2 - panic; at 104 s (70 + 5 x 210) / 6 = 186.7: 3 pods. Back to 70 at
    130 s: never below 3 while panicking; panic ends a stable window (60 s) after the last
    tick over the threshold, then the stable window decides."""
    model = warm(1)
    load = {"now": 70.0}
    kpa = Kpa(KpaSpec(), metric=lambda m, t: load["now"])
    decisions: dict[int, int | None] = {}
    for t in range(0, 260):
        load["now"] = 210.0 if 100 <= t < 130 else 70.0
        decisions[t] = kpa(model, float(t), 1)
        if t == 99:
            assert not kpa.panicking
        if t == 101:
            assert kpa.panicking
    assert (decisions[98], decisions[100], decisions[104]) == (1, 2, 3)
    assert decisions[99] is None  # a tick every 2 s
    # The panic window holds a 210 until 134 s, the last tick over the threshold.
    held = [d for t, d in decisions.items() if 104 <= t <= 194 and d is not None]
    assert held
    assert set(held) == {3}
    assert kpa.panicking is False
    assert decisions[196] == 1  # 62 s after 134 s


def test_knative_kpa_opens_in_panic_with_several_pods_and_scales_down_by_half_at_most() -> None:
    model = warm(8)
    kpa = Kpa(KpaSpec(), metric=lambda m, t: 0.0)
    assert kpa(model, 0.0, 8) == 8  # autoscaler.go New(): starts panicking, holds 8
    for t in range(1, 62):
        assert kpa(model, float(t), 8) in (None, 8)
    # Out of panic: the stable window wants 0, max-scale-down-rate 2 allows 8 / 2 = 4.
    assert kpa(model, 62.0, 8) == 4


@pytest.mark.parametrize(("use", "expected"), [
    (50.0, 4),  # on target
    (54.0, 4), (41.0, 4),  # inside the band: up 10 %, down 20 %
    (60.0, 5),  # r 1.2: ceil(4 x 1.2)
    (200.0, 8),  # r 4: 16, limited to 2 x 4
    (35.0, 3),  # r 0.7: ceil(2.8)
    (5.0, 2),  # r 0.1: 1, limited to 4 / 2
])
def test_apa_replicas(use: float, expected: int) -> None:
    assert apa_replicas(4, use) == expected


def test_apa_does_nothing_inside_its_tolerance_band() -> None:
    model = warm(4)
    level = {"per_pod": 54.0}
    apa = Apa(ApaSpec(), metric=lambda m, t: 4 * level["per_pod"])
    got = [apa(model, float(t), 4) for t in range(0, 120)]
    assert {d for d in got if d is not None} == {4}
    assert (got[0], got[1], got[10]) == (4, None, 4)  # a decision every 10 s
    level["per_pod"] = 80.0  # the 60 s window mean rises above 55 at once: scale up
    assert apa(model, 120.0, 4) == 5  # window (54 x 5 + 80) / 6 = 58.3: ceil(4 x 1.17)


def test_mm1_sizing_by_hand() -> None:
    # 40 requests/s, 0.15 s of a replica each, 0.35 s to wait: 8 replicas are at
    # rho 0.75, Wq = 0.75 x 0.15 / 0.25 = 0.45 s, too long; 9 at rho 2/3 wait 0.3 s.
    assert mm1_replicas(40.0, 0.15, 0.35) == 9
    assert mm1_replicas(40.0, 0.15, 0.45) == 8
    assert mm1_replicas(0.0, 0.15, 0.35) == 0
    assert mm1_replicas(40.0, 0.15, 0.0) is None


def test_queue_model_sizes_from_the_engine_counters() -> None:
    """2,400 requests (prompt 1,000, output 250) finished in the 60 s interval: 40/s.
    With prefill 20,000 tokens/s and decode 2,500: prefill 1,000 / 20,000 = 0.05 s, service
    0.05 + 250 / 2,500 = 0.15 s; a 0.4 s TTFT SLO leaves 0.35 s to wait: 9 replicas
    (test_mm1_sizing_by_hand)."""
    model = warm(2)
    wva = QueueModel(ServingParams(prefill_tps=20_000.0, decode_tps_max=2_500.0), slo_s=0.4)
    assert wva(model, 0.0, 2) is None  # the first look only sets the counters
    for i in range(2_400):
        r = InFlightRequest(i / 40.0, 1_000, 250, generated=250.0, prefilled=True)
        r.first_token = r.arrival + 0.05
        model.done.append(r)
    assert wva(model, 30.0, 2) is None  # evaluated every 60 s
    assert wva(model, 60.0, 2) == 9
    assert wva.rate == pytest.approx(40.0)
    # Requests now waiting count as arrivals too: 600 more in the queue, none finished:
    # 10/s. 2 replicas: rho 0.75, Wq 0.45 s > 0.35 s; 3: rho 0.5, Wq 0.15 s.
    model.arrive([InFlightRequest(60.0 + i / 10.0, 1_000, 250) for i in range(600)])
    assert wva(model, 120.0, 9) == 3


def test_run_policy_takes_a_deciders_count_clamped_to_the_bounds() -> None:
    def decider(model: ServingModel, now: float, current: int) -> int | None:
        return {60.0: 3, 120.0: 99, 180.0: 0}.get(now)

    requests = synthetic("diurnal", 300.0, 1.0)
    r = run_policy("d", requests, 300.0, ServingParams(), decider=decider,
                   min_replicas=1, max_replicas=5)
    assert [n for _, n, _, _ in r.timeline] == [1, 3, 5, 1, 1]


def test_baselines_lists_every_policy_fresh_on_each_call() -> None:
    names = [n for n, _ in baselines(ServingParams(), peak=6)]
    assert names == [
        "gpuscale vllm-inference", "gpuscale vllm-inference via Prometheus",
        "node-max GPU util (AverageValue)", "CPU-based HPA", "DCGM GPU util HPA",
        "KEDA prometheus vllm waiting", "Knative KPA", "AIBrix KPA", "AIBrix APA",
        "queue model (WVA-like)", "static at peak (6)"]
    assert "static at peak" not in " ".join(n for n, _ in baselines(ServingParams()))
    a, b = dict(baselines(ServingParams())), dict(baselines(ServingParams()))
    assert a["Knative KPA"]["decider"] is not b["Knative KPA"]["decider"]
    # The delayed pipelines observe every step through the hook, and let the HPA decide.
    dcgm = a["DCGM GPU util HPA"]
    assert isinstance(dcgm["signal"], Delayed)
    assert dcgm["decider"](ServingModel(), 0.0, 1) is None


def test_every_baseline_runs_a_short_window() -> None:
    requests = synthetic("bursts", 1_200.0, 4.0)
    for name, kwargs in baselines(ServingParams(), peak=4, start=2):
        r = run_policy(name, requests, 1_200.0, ServingParams(), **kwargs)
        assert (r.minutes, len(r.timeline)) == (20, 20), name
        if name.startswith("static"):
            assert {n for _, n, _, _ in r.timeline} == {4}
