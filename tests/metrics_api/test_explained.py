"""A workload an HPA reads through the metrics API is one the operator tools know: its
reads are noted in the scaler's trigger history under "Kind/name" with the selector the API
resolved, so the recorder's moment reads the same pods and finds the same plan."""

from __future__ import annotations

from typing import Any

import pytest

from gpuscale.metrics_api.answers import SOURCE, MetricAnswers, NotFound
from gpuscale.scaler.answers import Answers
from gpuscale.scaler.core.selector import parse_selector
from gpuscale.scaler.recorder import Recorder
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.scaler.state.history import TriggerHistory
from gpuscale.stream.records import PodRecord

PLANNED = "gpuscale_planned_replicas"


class Vllm:
    """The workload resolver's contract: Deployment llm/vllm selects app=vllm."""

    def target(self, namespace: str, kind: str, name: str) -> Any:
        return parse_selector("app=vllm") if (namespace, name) == ("llm", "vllm") else None


def vllm_pod(name: str, now: float) -> PodRecord:
    """A vLLM pod serving 0.4 replica-seconds per second, its GPU at 50 %."""
    return PodRecord("llm", name, "node-a", {"app": "vllm"}, None, True, {
        "gpu-utilization": 50.0, "vllm-prompt-tps": 6_000.0, "vllm-generation-tps": 2_400.0,
        "vllm-finished-rate": 2.0, "vllm-waiting": 0.0, "vllm-running": 8.0,
        "vllm-kv-cache": 20.0}, now)


def served(history: TriggerHistory) -> tuple[MetricAnswers, Recorder]:
    fleet = FleetView()
    fleet.update_node("node-a", [vllm_pod(f"vllm-{i}", fleet.now()) for i in range(2)])
    answers = Answers(fleet)  # no ScaledObject resolver: only the API's selector works
    return MetricAnswers(answers, Vllm(), history=history), Recorder(answers, history)


def test_reads_are_noted_under_the_kind_and_a_moment_finds_the_same_plan() -> None:
    history = TriggerHistory()
    api, recorder = served(history)
    item = api.object("llm", "deployments.apps", "vllm", PLANNED, "startupSeconds=100")
    (((ns, name), seen),) = history.items()
    assert (ns, name, seen.source) == ("llm", "Deployment/vllm", SOURCE)
    assert seen.metadata == {"profile": "vllm-planner", "startupSeconds": "100"}
    assert seen.selector is not None
    assert seen.selector.text == "app=vllm"
    moment, selection = recorder.moment(ns, name, seen)
    assert selection is not None
    assert len(selection.pods) == 2
    (answer,) = moment.answers
    assert (answer.unavailable, answer.value) == ("", item.value)
    assert moment.planned == item.value  # the API's plan, peeked, not a planner of its own
    assert dict(moment.terms)["startup"] == 100


def test_a_plain_metric_beside_the_planner_does_not_replace_it() -> None:
    history = TriggerHistory()
    api, _ = served(history)
    api.object("llm", "deployments.apps", "vllm", "gpuscale_gpu_utilization")
    seen = history.get("llm", "Deployment/vllm")
    assert seen is not None
    assert seen.metadata["signal"] == "gpu-utilization"
    api.object("llm", "deployments.apps", "vllm", PLANNED)
    api.object("llm", "deployments.apps", "vllm", "gpuscale_gpu_utilization")
    seen = history.get("llm", "Deployment/vllm")
    assert seen is not None
    assert seen.metadata == {"profile": "vllm-planner"}


def test_objects_that_do_not_exist_are_not_noted() -> None:
    history = TriggerHistory(max_triggers=3)
    api, _ = served(history)
    for i in range(10):  # a reader naming workloads at random fills nothing
        with pytest.raises(NotFound):
            api.object("llm", "deployments.apps", f"nope-{i}", PLANNED)
    assert history.items() == []
