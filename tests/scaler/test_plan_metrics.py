"""The plan and its terms on the scaler's /metrics, as Prometheus' own parser reads them."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuscale.scaler.core.planner import Observation, PlannerConfig
from gpuscale.scaler.edges.http import PlanCollector
from gpuscale.scaler.state.plan_book import PlanBook


def test_plans_and_terms_are_exported_per_scaledobject() -> None:
    book = PlanBook()

    def sample() -> Observation:  # 2.4 replica-seconds per second, 3 pods ready
        return Observation(prompt_tps=36_000.0, generation_tps=14_400.0, finished_rate=20.0,
                           waiting=0.0, running=30.0, kv_cache=60.0, ready=3, starting=1)

    book.plan("k", ("llm", "chat"), PlannerConfig(), sample, 0.0)
    registry = CollectorRegistry()
    registry.register(PlanCollector(book))
    families = {f.name: f for f in text_string_to_metric_families(
        generate_latest(registry).decode())}
    replicas = families["gpuscale_plan_replicas"].samples
    assert [(s.labels, s.value) for s in replicas] == [
        ({"namespace": "llm", "scaledobject": "chat"}, 4.0)]  # warming: 3 ready + 1 starting
    terms = {s.labels["term"]: s.value for s in families["gpuscale_plan_term"].samples}
    work = 36_000 / 30_000 + 14_400 / 12_000  # 2.4: past 2 replicas' worth, the room
    room = 1 / PlannerConfig().utilization - 1  # grows as the root of the work
    assert terms["steady"] == pytest.approx(work + room * math.sqrt(2 * work))
    assert (terms["ready"], terms["starting"]) == (3.0, 1.0)
    assert set(terms) == {"steady", "burst", "concurrency", "kv", "backlog", "required",
                          "arrived", "request_work", "capacity", "ready", "starting",
                          "growth", "kv_growth", "burst_excess", "startup",
                          "startup_pods", "held", "request_s", "drain_floor", "unheld",
                          "batch_capacity", "spare", "joined"}
    # No pod watch here: the default, measured over no pod.
    assert (terms["startup"], terms["startup_pods"]) == (300.0, 0.0)
