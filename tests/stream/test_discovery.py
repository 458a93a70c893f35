"""Agents found through their Service's EndpointSlices (watched), streams followed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuscale.agent.app import Agent, AgentConfig
from gpuscale.attribution.sources import ScenarioSources
from gpuscale.scaler.core.selector import parse_selector
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.stream.discovery import EndpointSliceDiscovery, addresses
from gpuscale.stream.subscriber import AgentSubscriber
from gpuscale.telemetry.scenario import parse_scenario
from gpuscale.telemetry.simulated_gpus import SimulatedBackend
from tests.peers.kubeapi import ENDPOINTSLICES, KubeApiPeer, api_client, make_endpointslice
from tests.support.polling import until
from tests.support.strategies import json_values

DOC = {"nodes": [{"name": f"n{i}", "gpus": [{"model": "L4"}], "processes": [
    {"gpu": 0, "memory_mib": 100, "load": {"constant": 10 * (i + 1)},
     "pod": {"namespace": "ns", "name": f"w-{i}", "container": "c"}}]} for i in range(2)]}




@pytest.fixture
async def agents() -> AsyncIterator[list[Agent]]:
    out, tasks = [], []
    for node in parse_scenario(DOC).nodes:
        agent = Agent(SimulatedBackend(node), AgentConfig("127.0.0.1", 0, 0.2, node.name, 0),
                      ScenarioSources(node))
        bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        tasks.append(asyncio.create_task(agent.run(bound.set_result)))
        await bound
        out.append(agent)
    yield out
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_endpointslices_drive_the_subscriptions(agents: list[Agent]) -> None:
    peer = KubeApiPeer()
    await peer.start()
    api = api_client(peer)
    fleet = FleetView()
    sub = AgentSubscriber(fleet, "test", forget_after=0.0)
    a, b = (ag.stream_port for ag in agents)
    peer.add(make_endpointslice("gpuscale-agent", "s1", [("127.0.0.1", True)], a),
             ENDPOINTSLICES)
    peer.add(make_endpointslice("someone-else", "s9", [("127.0.0.9", True)], 1),
             ENDPOINTSLICES)
    disco = EndpointSliceDiscovery(api, "gpuscale", "gpuscale-agent", sub.set_addresses,
                                   backoff_s=(0.05,))
    task = asyncio.create_task(disco.run())
    sel = parse_selector("app=w")
    try:
        await until(lambda: [r.name for r in fleet.select("ns", sel)] == ["w-0"])
        assert set(sub.links) == {f"127.0.0.1:{a}"}
        # The Service gains the second agent (a second slice), and loses the first.
        peer.add(make_endpointslice("gpuscale-agent", "s2", [("127.0.0.1", True)], b),
                 ENDPOINTSLICES)
        await until(lambda: len(fleet.select("ns", sel)) == 2)
        peer.modify(make_endpointslice("gpuscale-agent", "s1", [("127.0.0.1", False)], a),
                    ENDPOINTSLICES)
        await until(lambda: set(sub.links) == {f"127.0.0.1:{b}"})
        sub.sweep()  # forget_after=0: node n0 is forgotten at once here
        assert [r.name for r in fleet.select("ns", sel)] == ["w-1"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)  # before its client closes
        await sub.close()
        await api.close()
        await peer.stop()


def test_addresses_from_slices() -> None:
    slices = [make_endpointslice("s", "a", [("10.0.0.1", True), ("10.0.0.2", False)], 9401,
                                 nodes=["gpu-1", "gpu-2"]),
              make_endpointslice("s", "b", [("10.0.0.3", True)], None)]
    slices[1]["endpoints"][0]["conditions"] = {}  # unknown readiness counts as ready
    v6 = make_endpointslice("s", "c", [("fd00::1", True)], 9401, nodes=["gpu-6"])
    v6["addressType"] = "IPv6"
    assert addresses([*slices, v6], "telemetry", 7777) == {
        "10.0.0.1:9401": "gpu-1", "10.0.0.3:7777": "", "[fd00::1]:9401": "gpu-6"}


SLICE_KEYS = ["ports", "name", "port", "addressType", "endpoints", "conditions", "ready",
              "addresses", "nodeName"]


@given(st.lists(json_values(SLICE_KEYS), max_size=3))
def test_any_json_slices_read_as_addresses(slices: list[object]) -> None:
    """Whatever a slice's fields hold, reading it never raises: a field of the wrong JSON
    type reads as absent."""
    got = addresses([s if isinstance(s, dict) else {"endpoints": s} for s in slices],
                    "telemetry", 7777)
    assert all(isinstance(a, str) and isinstance(n, str) for a, n in got.items())
