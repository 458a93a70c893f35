"""Spare replicas while a scale-up starts (``spareReplicas``, scaler.core.hedge): asked on
top of the plan only while it needs pods that are not Ready, never while warming, never
below the plan; the key's range."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuscale.scaler.core.hedge import spare
from gpuscale.scaler.core.planner import Planner
from gpuscale.scaler.core.trigger import MetadataError, parse_metadata
from tests.scaler.planner_load import CFG, busy, run


def test_a_spare_only_while_the_plan_needs_pods_that_are_not_ready() -> None:
    assert spare(1, planned=3, ready=2, warming=False) == 1
    assert spare(2, planned=3, ready=0, warming=False) == 2  # from zero too
    assert spare(1, planned=3, ready=3, warming=False) == 0  # the plan's pods are Ready
    assert spare(1, planned=2, ready=3, warming=False) == 0  # a scale-down
    assert spare(1, planned=3, ready=2, warming=True) == 0  # warming keeps what exists
    assert spare(0, planned=3, ready=2, warming=False) == 0  # the default


def test_the_planner_asks_the_spare_on_top_and_drops_it_once_its_pods_are_ready() -> None:
    """2.4 replicas of work plans 3 (test_planner's steady case): with two Ready and one
    starting, one spare more; once three are Ready the ask is the plan's 3 again (the
    HPA's scale-down then removes the spare, or the slower pod, while not Ready)."""
    plain, hedged = Planner(CFG), Planner(replace(CFG, spare_replicas=1))
    for p in (plain, hedged):
        run(p, range(0, 200), busy(2.4, ready=2, starting=2))
    assert plain.current(199.0).replicas == 3
    plan = hedged.current(199.0)
    assert (plan.replicas, plan.spare, plan.unheld) == (4, 1, 3)
    assert plan.terms()["spare"] == 1.0
    run(hedged, range(200, 210), busy(2.4, ready=3, starting=1))
    plan = hedged.current(209.0)
    assert (plan.replicas, plan.spare) == (3, 0)


def test_no_spare_while_warming() -> None:
    """A planner that has not seen a hold window keeps every pod that exists: a spare
    would be counted as one and kept."""
    p = Planner(replace(CFG, spare_replicas=1))
    run(p, range(0, 50), busy(2.4, ready=2, starting=1))
    plan = p.current(49.0)
    assert plan.warming
    assert (plan.replicas, plan.spare) == (3, 0)


def test_the_key_takes_a_whole_number_up_to_ten() -> None:
    def parsed(value: str) -> int:
        cfg = parse_metadata({"profile": "vllm-planner", "spareReplicas": value}).planner
        assert cfg is not None
        return cfg.spare_replicas

    assert parsed("0") == 0
    assert parsed("2") == 2
    assert parsed("10") == 10
    for bad, why in (("1.5", "whole number"), ("11", "between 0 and 10"),
                     ("-1", "between 0"), ("one", "not a number")):
        with pytest.raises(MetadataError, match=f"spareReplicas: .*{why}"):
            parsed(bad)
