"""A simulated agent serves the engines its scenario advertises: ``gpuscale agent
--gpu-backend sim`` on its default scenario answers the vllm-inference profile, with no
``demo --scenario`` beside it."""

from __future__ import annotations

import asyncio
import logging

import pytest

from gpuscale.agent.app import Agent, AgentConfig
from gpuscale.cli import build_parser
from gpuscale.cli.backend import make_backend, make_sources
from gpuscale.common.errors import Unavailable
from gpuscale.engines.scenario_engines import ServedScenarioSources
from gpuscale.scaler.answers import Answers, Value, Workload
from gpuscale.scaler.core.trigger import parse_metadata
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.telemetry.scenario import load_scenario
from gpuscale.telemetry.simulated_gpus import SimulatedBackend
from tests.support.polling import until


async def test_the_agents_default_scenario_answers_ok_for_vllm_inference(
        caplog: pytest.LogCaptureFixture) -> None:
    args = build_parser().parse_args(["agent", "--gpu-backend", "sim", "--interval", "0.2",
                                      "--port", "0", "--stream-port", "-1"])
    backend = make_backend(args)
    sources = await make_sources(args, backend)
    assert isinstance(sources, ServedScenarioSources)
    agent = Agent(backend, AgentConfig("127.0.0.1", 0, 0.2, "", None), sources)
    fleet = FleetView()
    agent.add_sink(fleet)
    answers = Answers(fleet)
    trigger = parse_metadata({"podSelector": "app=vllm-llama", "profile": "vllm-inference"})
    workload = Workload("llm", "vllm-llama", trigger)
    selector = trigger.selector
    assert selector is not None

    def values() -> list[Value | Unavailable]:
        return [answers.value(workload, t) for t in trigger.targets]

    with caplog.at_level(logging.WARNING):
        task = asyncio.create_task(agent.run())
        try:
            await until(lambda: len(fleet.select("llm", selector)) == 4, 15.0,
                        "the four replicas reported")
            got = await until(lambda: all(isinstance(v, Value) for v in values()) and
                              values(), 15.0, "vllm-inference answered OK")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    assert [v.counted for v in got if isinstance(v, Value)] == [4] * len(got)  # 4 replicas
    assert [r.getMessage() for r in caplog.records] == []  # no "connection refused"


async def test_engines_follow_the_scenarios_pods() -> None:
    """A followed scenario file drops a pod: its engine stops; the others keep theirs."""
    node = load_scenario("h100-vllm").nodes[0]
    backend = SimulatedBackend(node)
    sources = ServedScenarioSources(lambda: backend.node, backend.scenario_time)
    try:
        await sources.reconcile()
        served = sources.served()
        assert sorted(name for _, name in served) == [f"vllm-llama-{i}" for i in range(4)]
        backend.replace_node(type(node)(node.name, node.gpus, tuple(
            p for p in node.processes if p.pod is None or p.pod.name != "vllm-llama-3")))
        await sources.reconcile()
        assert sources.served() == {k: a for k, a in served.items()
                                    if k != ("llm", "vllm-llama-3")}
    finally:
        await sources.close()
    assert sources.served() == {}
