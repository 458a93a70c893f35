"""The planner is given the objective it is judged by (``sim.compare.planner_objective``):
under each ``--slo`` the planner's parsed trigger plans for what the judge allows."""

from __future__ import annotations

import pytest

from gpuscale.models.serving import ServingParams
from gpuscale.models.slo import SLO_SPECS, SloSpec
from gpuscale.scaler.core.plan_values import PlannerConfig
from gpuscale.scaler.core.planner import Planner
from gpuscale.sim.compare import planner_objective, policy_runs
from gpuscale.sim.scaler_adapter import PlannerPolicy
from gpuscale.traffic.trace import TraceRequest


def _planner_config(slo: SloSpec, requests: list[TraceRequest]) -> PlannerConfig:
    runs = dict(policy_runs(ServingParams(), requests, slo, min_replicas=1, start=1))
    signal = runs["planner"]["signal"]
    assert isinstance(signal, PlannerPolicy)
    config = signal._sim.trigger.planner
    assert config is not None
    return config


def test_each_objective_reaches_the_planners_trigger() -> None:
    long = [TraceRequest(float(t), 12_000, 100) for t in range(60)]
    ttft = _planner_config(SLO_SPECS["ttft"], long)
    prefill = ServingParams().prefill_tps
    assert ttft.ttft_s == 2.0
    assert ttft.delay_s == pytest.approx(2.0 - 1_000 / prefill)
    assert _planner_config(SLO_SPECS["ttft-tpot"], long).ttft_s == 2.0
    queue = _planner_config(SLO_SPECS["queue"], long)
    assert (queue.ttft_s, queue.delay_s) == (None, 1.0)  # was: ttftSeconds 2
    # ttft-per-token: 1 s + 0.5 ms a prompt token - 7 s for these 12k-token prompts, as the
    # judge allows them (was: ttftSeconds 2 whatever the prompts).
    per_token = _planner_config(SLO_SPECS["ttft-per-token"], long)
    assert (per_token.ttft_s, per_token.ttft_per_token_s) == (1.0, 0.0005)
    assert per_token.prompt_tokens == 12_000.0
    assert Planner(per_token).delay() == pytest.approx(7.0 - 12_000 / prefill)


def test_the_per_token_keys_follow_the_spec_and_the_prompts() -> None:
    spec = SloSpec("ttft-per-token", 0.001, allowance_s=0.5)
    mixed = [TraceRequest(0.0, 1_000, 10), TraceRequest(1.0, 3_000, 10)]
    assert planner_objective(spec, mixed) == {
        "ttftSeconds": "0.5", "ttftSecondsPerPromptToken": "0.001", "promptTokens": "2000"}
    # No allowance: the trigger's floor of 0.01 s; no request: a 1-token prompt, not 0/0.
    bare = planner_objective(SloSpec("ttft-per-token", 0.001), [])
    assert bare == {"ttftSeconds": "0.01", "ttftSecondsPerPromptToken": "0.001",
                    "promptTokens": "1"}
