"""The plan book: planners made on first ask, ticked, bounded, forgotten when idle."""

from __future__ import annotations

import pytest

from gpuscale.scaler.core.aggregate import WorkloadUnavailable
from gpuscale.scaler.core.planner import Observation, PlannerConfig, PlanUnavailable
from gpuscale.scaler.state.plan_book import PlanBook, TooManyPlans

CFG = PlannerConfig()


def obs(ready: int = 1) -> Observation:
    return Observation(prompt_tps=3000.0, generation_tps=1200.0, finished_rate=1.0,
                       waiting=0.0, running=4.0, kv_cache=10.0, ready=ready, starting=0)


def test_first_ask_observes_and_ticks_observe_again() -> None:
    book = PlanBook()
    calls: list[float] = []

    def sample() -> Observation:
        calls.append(0.0)
        return obs()

    assert book.plan("a", ("ns", "a"), CFG, sample, 10.0).replicas == 1
    book.tick(11.0)
    book.tick(12.0, ["a", "gone"])  # a key that is not there is skipped
    assert len(calls) == 3
    assert [label for label, _ in book.plans()] == [("ns", "a")]


def test_a_failing_sample_keeps_the_reason_for_the_answer() -> None:
    book = PlanBook()

    def broken() -> Observation:
        raise WorkloadUnavailable("1 of 2 pods have no usable vllm-prompt-tps: ns/p-1")

    with pytest.raises(PlanUnavailable, match=r"no plan yet.*ns/p-1"):
        book.plan("a", ("ns", "a"), CFG, broken, 0.0)


def test_bounded_and_forgotten_when_nobody_asks() -> None:
    book = PlanBook(max_workloads=2, idle_s=60.0)
    book.plan("a", ("ns", "a"), CFG, obs, 0.0)
    book.plan("b", ("ns", "b"), CFG, obs, 0.0)
    with pytest.raises(TooManyPlans, match="already plans 2 workloads"):
        book.plan("c", ("ns", "c"), CFG, obs, 0.0)
    book.tick(50.0)
    book.plan("b", ("ns", "b"), CFG, obs, 50.0)  # asked again: kept
    book.tick(70.0)
    assert book.keys() == ["b"]
    assert book.plan("c", ("ns", "c"), CFG, obs, 70.0).replicas == 1


def test_a_planner_nobody_ticks_goes_stale_saying_so() -> None:
    book = PlanBook()
    book.plan("a", ("ns", "a"), CFG, obs, 0.0)
    with pytest.raises(PlanUnavailable, match="planner loop running"):
        book.plan("a", ("ns", "a"), CFG, obs, 30.0)


def test_a_bug_in_one_workload_fails_its_plan_not_the_loop() -> None:
    book = PlanBook()

    def buggy() -> Observation:
        raise ZeroDivisionError("oops")

    with pytest.raises(PlanUnavailable, match=r"internal error in gpuscale \(ZeroDivisionError"):
        book.plan("a", ("ns", "a"), CFG, buggy, 0.0)
    book.plan("b", ("ns", "b"), CFG, obs, 0.0)
    book.tick(1.0)  # does not raise
    assert [label for label, _ in book.plans()] == [("ns", "b")]


def test_an_observation_carries_each_ready_pods_own_load() -> None:
    from gpuscale.scaler.state.fleet import FleetView
    from gpuscale.scaler.state.plan_book import observe
    from gpuscale.stream.records import PodRecord

    now = [100.0]
    fleet = FleetView(monotonic=lambda: now[0])

    def record(name: str, prompt: float, waiting: float, ready: bool = True) -> PodRecord:
        signals = {"vllm-prompt-tps": prompt, "vllm-generation-tps": 1200.0,
                   "vllm-finished-rate": 1.0, "vllm-waiting": waiting,
                   "vllm-running": 4.0, "vllm-kv-cache": 10.0}
        return PodRecord("llm", name, "node-a", {"app": "vllm"}, None, ready,
                         signals if ready else {}, now[0])

    pods = [record("a", 3000.0, 5.0), record("b", 600.0, 0.0), record("c", 0.0, 0.0, False)]
    fleet.update_node("node-a", pods)
    got = observe(fleet, pods, ())
    assert (got.ready, got.starting, got.waiting) == (2, 1, 5.0)
    assert [(p.name, p.prompt_tps, p.waiting) for p in got.pods] == [
        ("llm/a", 3000.0, 5.0), ("llm/b", 600.0, 0.0)]  # the starting pod has no load
