"""Scenario attribution that follows a changing node (a simulated backend reading its
scenario file again): new pods are attributed, gone ones are not, and pods keep their IPs."""

from __future__ import annotations

from typing import Any

from gpuscale.attribution.model import PodInfo
from gpuscale.attribution.sources import ScenarioSources, attribute_tick
from gpuscale.telemetry.model import Absent
from gpuscale.telemetry.scenario import NodeSpec, parse_scenario
from gpuscale.telemetry.simulated_gpus import SimulatedBackend


def node(*pods: tuple[int, str, float]) -> NodeSpec:
    procs: list[dict[str, Any]] = [
        {"gpu": gpu, "pid": 4000 + gpu, "memory": 0.5, "load": {"constant": load},
         "pod": {"namespace": "llm", "name": name, "container": "vllm"}}
        for gpu, name, load in pods]
    return parse_scenario({"nodes": [{"name": "n1", "gpus": [{"model": "L4", "count": 3}],
                                      "processes": procs}]}).nodes[0]


def infos(src: ScenarioSources) -> dict[str, PodInfo]:
    got = src.pod_infos()
    assert not isinstance(got, Absent)
    return {name: info for (_, name), info in got.items()}


async def test_sources_follow_the_node_and_pods_keep_their_ips() -> None:
    backend = SimulatedBackend(node((0, "chat-a", 40), (1, "chat-b", 50)))
    src = ScenarioSources(lambda: backend.node)
    first = infos(src)
    assert {n: i.ip for n, i in first.items()} == {"chat-a": "127.1.0.10",
                                                   "chat-b": "127.1.0.11"}
    backend.replace_node(node((1, "chat-b", 70), (2, "chat-c", 30)))
    result = await attribute_tick(src, backend.sample())
    assert {p.pod: p.utilization_percent for p in result.pods} == {"chat-b": 70.0,
                                                                  "chat-c": 30.0}
    now = infos(src)
    assert now["chat-b"] == first["chat-b"]  # same IP, UID and containers
    assert now["chat-c"].ip not in {"127.1.0.10", "127.1.0.11"}

