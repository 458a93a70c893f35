"""One freshness rule, by each agent's own bound (common.freshness): an agent at
``--interval 5`` (bound 15 s) whose last report is 4 s old is fresh everywhere - its
workload's answer, the usage history's devices, the Inspect service's node and ``top`` -
and 16 s old it is stale everywhere. (Before, the recorder and ``top`` judged its node by
the scaler's 3 s default: every GPU showed stale and left the usage history while its
workload answered OK.)"""

from __future__ import annotations

from typing import Any

import pytest

from gpuscale.common.errors import Unavailable
from gpuscale.common.freshness import MAX_STALE_S, MIN_STALE_S, is_stale, staleness_bound
from gpuscale.proto import inspect_pb2 as ipb
from gpuscale.scaler.answers import Answers, Value, Workload
from gpuscale.scaler.core.profiles import Target
from gpuscale.scaler.core.trigger import parse_metadata
from gpuscale.scaler.edges.inspect import Inspector
from gpuscale.scaler.recorder import Recorder
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.scaler.state.history import TriggerHistory
from gpuscale.stream.records import DeviceRecord, NodeReport, PodRecord, deliver
from gpuscale.tools import top

INTERVAL = 5.0


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


async def judged(age: float) -> tuple[Any, bool, bool, bool]:
    """(the workload's answer, whether the recorder keeps the node's devices, whether the
    Inspect reply's node is stale to ``top``, whether top shows the pod stale) for an
    agent at INTERVAL whose report is ``age`` seconds old."""
    clock = Clock()
    fleet = FleetView(monotonic=clock)  # the scaler's default bound: 3 s
    bound = staleness_bound(INTERVAL)
    pod = PodRecord("llm", "vllm-0", "node-a", {"app": "vllm"}, None, True,
                    {"gpu-utilization": 40.0}, clock.now, bound)
    device = DeviceRecord("GPU-1", 0, "NVIDIA H100", utilization=40.0, pods=("llm/vllm-0",))
    assert deliver(NodeReport("node-a", 1, clock.now, INTERVAL, (pod,), (device,)), fleet,
                   "node-a")
    clock.now += age
    answers = Answers(fleet)
    got = answers.value(Workload("llm", "chat", parse_metadata(
        {"podSelector": "app=vllm", "profile": "gpu-utilization"})),
        Target("gpu-utilization", 70.0, 5.0))
    recorder = Recorder(answers, TriggerHistory())
    kept = "node-a" in recorder.live_devices()
    reply = await Inspector(recorder).Fleet(ipb.FleetRequest(), None)  # type: ignore[arg-type]
    assert reply.nodes[0].stale_after == bound
    view = top.build(reply)
    node_stale = "stale" in top.explain_row(view.devices.rows[0])
    pod_stale = "stale" in top.explain_row(view.pods.rows[0])
    return got, kept, node_stale, pod_stale


async def test_an_agent_is_judged_by_its_own_bound() -> None:
    got, kept, node_stale, pod_stale = await judged(4.0)
    assert isinstance(got, Value)
    assert got.value == 40.0
    assert (kept, node_stale, pod_stale) == (True, False, False)
    got, kept, node_stale, pod_stale = await judged(16.0)
    assert isinstance(got, Unavailable)
    assert "stale: 16.0s old, bound 15.0s" in got.reason
    assert (kept, node_stale, pod_stale) == (False, True, True)


@pytest.mark.parametrize("interval", [float("nan"), float("inf"), -1.0, 0.0])
def test_an_interval_that_is_no_cadence_gets_the_shortest_bound(interval: float) -> None:
    """A broken or hostile agent's interval must not make its readings count for ever."""
    assert staleness_bound(interval) == MIN_STALE_S
    assert is_stale(MIN_STALE_S + 0.1, staleness_bound(interval))


def test_a_huge_interval_does_not_keep_a_quiet_node_fresh() -> None:
    """An agent announcing an interval of 1e9 s (finite, positive) is still stale once
    MAX_STALE_S has passed without a reading."""
    assert staleness_bound(1e9) == MAX_STALE_S
    assert is_stale(MAX_STALE_S + 0.1, staleness_bound(1e9))
    assert staleness_bound(100.0) == MAX_STALE_S  # the slowest cadence still whole


def test_the_bound_itself() -> None:
    assert staleness_bound(5.0) == 15.0
    assert staleness_bound(0.2) == MIN_STALE_S
    assert not is_stale(15.0, 15.0)  # exactly at the bound still counts
    assert is_stale(15.01, 15.0)
