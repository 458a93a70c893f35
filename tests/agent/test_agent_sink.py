"""The agent's reports reaching a fleet view in the same process (the demo's wiring) and
its telemetry stream alike: while a GPU pod's metadata is not known, the view gets nothing
- not an empty node - and the stream says why."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

import pytest

from gpuscale.agent.app import Agent, AgentConfig
from gpuscale.attribution.devices import parse_device_id
from gpuscale.attribution.model import Allocation, PodInfo, PodPhase
from gpuscale.attribution.sources import AttributionInputs
from gpuscale.scaler.core.selector import parse_selector
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.telemetry.model import Absent, NodeSnapshot
from gpuscale.telemetry.scenario import gpu_uuid, load_scenario
from gpuscale.telemetry.simulated_gpus import SimulatedBackend
from tests.support.polling import until

NODE = load_scenario("h100-vllm").nodes[0]
V0 = PodInfo("llm", "v-0", "uid-v-0", labels=(("app", "vllm"),), phase=PodPhase.RUNNING,
             ready=True)


class Sources:
    """llm/v-0 holds GPU 0; the pod cache knows it only while ``known`` is set."""

    def __init__(self) -> None:
        self.known = False
        self._allocations = (Allocation("llm", "v-0", "engine", "nvidia.com/gpu",
                                        (parse_device_id(gpu_uuid(NODE.name, 0)),)),)

    async def gather(self, snapshot: NodeSnapshot) -> AttributionInputs:
        return AttributionInputs(self._allocations, time.time(), self.pod_infos(), {}, ())

    async def run(self) -> None:
        await asyncio.Event().wait()

    async def close(self) -> None:
        pass

    def pod_infos(self) -> Mapping[tuple[str, str], PodInfo] | Absent:
        return {("llm", "v-0"): V0} if self.known else {}


async def test_an_incomplete_tick_never_reaches_the_fleet_view() -> None:
    sources = Sources()
    agent = Agent(SimulatedBackend(NODE), AgentConfig("127.0.0.1", 0, 0.2, "host-a",
                                                      stream_port=0), sources)
    fleet = FleetView()
    agent.add_sink(fleet)
    assert agent.publisher is not None
    task = asyncio.create_task(agent.run())

    async def ticks(n: int) -> None:
        latest = agent.sampler.latest
        await agent.sampler.wait_for((latest.seq if latest else 0) + n)

    try:
        await ticks(3)
        assert fleet.nodes() == {}  # no update at all, not an empty one
        assert fleet.pod_count() == 0
        latest = agent.publisher._latest
        assert latest is not None
        assert not latest.attribution_ok
        assert latest.attribution_detail.startswith("pod metadata not known yet for llm/v-0")

        sources.known = True
        await until(lambda: fleet.pod_count() == 1, what="the pod in the fleet view")
        assert list(fleet.nodes()) == [NODE.name]  # keyed by the node the readings are from

        sources.known = False  # the pod cache lost it: not known again
        await ticks(2)
        [kept] = fleet.select("llm", parse_selector("app=vllm"))
        await ticks(3)
        assert fleet.select("llm", parse_selector("app=vllm")) == [kept]  # kept, aging
        assert fleet.nodes()[NODE.name] > 0.4
        latest = agent.publisher._latest
        assert latest is not None
        assert not latest.attribution_ok
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
