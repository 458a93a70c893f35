"""``gpuscale simulate --planner KEY=VALUE``: the planner's trigger keys on a simulated run,
checked as the scaler checks a trigger's before any minute is simulated, and reaching
the planner that runs."""

from __future__ import annotations

import pytest

from gpuscale.cli.simulate import planner_keys
from gpuscale.sim.compare import compare
from gpuscale.traffic.requests import load_requests


def test_keys_are_parsed_and_checked_as_a_trigger() -> None:
    assert planner_keys([]) == {}
    assert planner_keys(["spareReplicas=1", "utilization=0.9"]) == {
        "spareReplicas": "1", "utilization": "0.9"}


@pytest.mark.parametrize(("item", "said"), [
    ("spareReplicas", "KEY=VALUE, not 'spareReplicas'"),
    ("=1", "KEY=VALUE"),
    ("ttftSeconds=3", "ttftSeconds is the objective's: give it with --slo"),
    ("promptTokens=900", "promptTokens is the objective's"),
    ("profile=gpu-utilization", "'profile' is not a planner key; they are "
                                "decodeTokensPerSecond, drainSeconds"),
    ("spareReplicas=1.5", "--planner: spareReplicas: a whole number of replicas"),
    ("utilization=7", "--planner: utilization: must be between 0.1 and 1"),
    ("maxBatch=" + "9" * 5000, "--planner: maxBatch:"),
])
def test_a_bad_key_is_refused_by_name(item: str, said: str) -> None:
    with pytest.raises(ValueError, match=r"^--planner: ") as got:
        planner_keys([item])
    assert said in str(got.value)
    assert len(str(got.value)) < 400  # a hostile value is not echoed whole


def test_the_keys_reach_the_planner_that_runs() -> None:
    """A planner told to keep its pods a third busy runs more replicas than its default."""
    requests, duration = load_requests("steps", None, 30.0, 600.0)
    default = compare(requests, duration, shown=["planner"])
    roomy = compare(requests, duration, shown=["planner"], planner={"utilization": "0.3"})
    assert roomy.results[0].gpu_hours > default.results[0].gpu_hours
