"""The planner in the simulator: the replicas' counters become the per-pod rates the
scaler's planner reads, and its value drives the HPA model."""

from __future__ import annotations

import pytest

from gpuscale.common.errors import Unavailable
from gpuscale.models.serving import InFlightRequest, ServingModel, ServingParams, planner_metadata
from gpuscale.scaler.core.planner import Plan
from gpuscale.sim.scaler_adapter import PlannerPolicy, planner_policy
from gpuscale.sim.simulate import run_policy
from gpuscale.traffic.patterns import synthetic

PARAMS = ServingParams()


def test_rates_come_from_the_replicas_counters() -> None:
    model = ServingModel(PARAMS)
    model.set_replicas(2, 0.0, warm=True)
    policy = PlannerPolicy(planner_metadata(PARAMS))
    model.arrive([InFlightRequest(0.0, 2000, 400) for _ in range(40)])
    model.step(0.0, 1.0)
    policy.tick(model, 0.0)  # first scrape of each counter: no rate yet
    none = policy.plan(0.0)
    assert isinstance(none, Unavailable)
    assert "no plan yet" in none.reason
    before = [(r.prompt_tokens, r.generation_tokens) for r in model.replicas]
    model.step(1.0, 1.0)
    policy.tick(model, 1.0)
    after = [(r.prompt_tokens, r.generation_tokens) for r in model.replicas]
    prompt = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
    generated = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
    assert generated > 0
    plan = policy.plan(1.0)
    assert isinstance(plan, Plan)
    # Nothing waits, so the work that arrived is the work served in that second.
    assert plan.arrived == pytest.approx(prompt / PARAMS.prefill_tps
                                         + generated / PARAMS.decode_tps_max)
    assert plan.ready == 2


def test_the_value_is_the_plan_times_the_target_and_none_without_a_plan() -> None:
    model = ServingModel(PARAMS)
    model.set_replicas(1, 0.0, warm=True)
    policy = PlannerPolicy({**planner_metadata(PARAMS), "targetValue": "10"})
    assert policy(model, 0.0)[0].value is None  # no plan: the HPA holds
    for t in range(3):
        model.step(float(t), 1.0)
        policy.tick(model, float(t))
    metric = policy(model, 2.0)[0]
    plan = policy.plan(2.0)
    assert isinstance(plan, Plan)
    assert metric.value == plan.replicas * 10
    assert metric.target == 10


def test_the_planner_runs_the_hpa_with_its_own_hold() -> None:
    kwargs = planner_policy(PARAMS)
    assert kwargs["scale_down"].stabilization_s == 0
    requests = synthetic("steps", 900.0, 20.0)
    r = run_policy("planner", requests, 1200.0, PARAMS, start=1, **kwargs)
    assert r.unserved == 0
    assert r.max_replicas >= 2  # the middle step needs more than one replica's work
