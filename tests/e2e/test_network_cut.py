"""A network cut between an agent process and the scaler, made without privileges: the
agent's stream is reached through a loopback path (tests/peers/netcut.py) that stops
moving bytes while every connection stays open - what a partition looks like (the stream
just goes silent) - and later cuts the connections outright. Its workload must turn
UNAVAILABLE within the staleness bound, and recover when the path comes back.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuscale.scaler.core.aggregate import WorkloadUnavailable, evaluate
from gpuscale.scaler.core.profiles import Target, ValueMode
from gpuscale.scaler.core.selector import parse_selector
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.stream.subscriber import AgentSubscriber
from tests.peers.netcut import NetPath
from tests.support.polling import until
from tests.support.ports import free_port

pytestmark = pytest.mark.slow

SCENARIO = """
nodes:
  - name: cut-node
    gpus: [{model: L4}]
    processes:
      - {gpu: 0, memory_mib: 1000, load: {constant: 42},
         pod: {namespace: ns, name: w-0, container: c}}
"""


@pytest.fixture
def agent_port(tmp_path: Path) -> Iterator[int]:
    """An agent process on a simulated node; its telemetry stream port."""
    scenario = tmp_path / "s.yaml"
    scenario.write_text(SCENARIO)
    port = free_port()
    agent = subprocess.Popen(
        [sys.executable, "-m", "gpuscale.cli", "agent", "--gpu-backend", "sim",
         "--scenario", str(scenario), "--host", "127.0.0.1", "--port", "0",
         "--stream-port", str(port), "--stream-insecure", "--interval", "0.5"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert agent.stdout is not None
    assert "gpuscale agent" in agent.stdout.readline()
    try:
        yield port
    finally:
        agent.terminate()
        agent.wait(10)


async def test_cut_link_makes_the_workload_unavailable_then_recovers(agent_port: int) -> None:
    path = NetPath(agent_port)
    await path.start()
    fleet = FleetView()
    sub = AgentSubscriber(fleet, "test", backoff_s=(0.1, 0.5))
    sub.set_addresses([f"127.0.0.1:{path.port}"])
    sel, target = parse_selector("app=w"), Target("gpu-utilization", 70.0, 0.0)

    def value() -> float | str:
        try:
            return evaluate(fleet, fleet.select("ns", sel), target, ValueMode.SUM).value
        except WorkloadUnavailable as exc:
            return str(exc)

    def reads(expect: object) -> Callable[[], bool]:
        """The workload's value is ``expect`` (a type: an error message of that type)."""
        def check() -> bool:
            got = value()
            return isinstance(got, expect) if isinstance(expect, type) else got == expect
        return check

    try:
        await until(reads(42.0), 20, what="value 42")
        path.freeze()  # traffic held, nothing closed
        await until(reads(str), 10, what="an UNAVAILABLE reason")
        assert "stale" in str(value())
        path.heal()
        await until(reads(42.0), 40, what="value 42 after the freeze")
        path.cut()  # connections reset, new ones refused
        await until(reads(str), 10, what="UNAVAILABLE after the cut")
        path.heal()
        await until(reads(42.0), 40, what="value 42 after the cut")
    finally:
        await sub.close()
        await path.stop()
