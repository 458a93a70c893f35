"""Agents in the test's own process, over simulated GPUs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from gpuscale.agent.app import Agent, AgentConfig
from gpuscale.attribution.sources import ScenarioSources
from gpuscale.telemetry.scenario import NodeSpec
from gpuscale.telemetry.simulated_gpus import SimulatedBackend


@asynccontextmanager
async def running_agents(nodes: list[NodeSpec], interval: float = 0.2,
                         stream_ports: list[int] | None = None,
                         hostnames: list[str] | None = None,
                         sources: list[ScenarioSources] | None = None,
                         ) -> AsyncIterator[list[Agent]]:
    """In-process agents over simulated GPUs and their scenario's pods (or ``sources``,
    one per node), each serving its telemetry stream on loopback (port 0 unless
    ``stream_ports`` says), stopped on exit."""
    agents, tasks = [], []
    for i, node in enumerate(nodes):
        port = stream_ports[i] if stream_ports else 0
        name = hostnames[i] if hostnames else node.name
        agent = Agent(SimulatedBackend(node), AgentConfig("127.0.0.1", 0, interval, name,
                                                          port),
                      sources[i] if sources else ScenarioSources(node))
        bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        tasks.append(asyncio.create_task(agent.run(bound.set_result)))
        await bound
        agents.append(agent)
    try:
        yield agents
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
