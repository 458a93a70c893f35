"""A network cut between an agent and the scaler, with a network namespace this test makes.

The agent runs in its own namespace behind a veth pair; bringing the link down drops its
traffic without closing anything (the stream just goes silent). Its workload must turn
UNAVAILABLE within the staleness bound, and recover when the link comes back.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuscale.scaler.evaluate import WorkloadUnavailable, evaluate
from gpuscale.scaler.fleet import FleetView
from gpuscale.scaler.profiles import Target, ValueMode
from gpuscale.scaler.selector import parse_selector
from gpuscale.stream.subscriber import AgentSubscriber
from tests.conftest import until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                       reason="needs root and iproute2 to make a network namespace"),
]

SCENARIO = """
nodes:
  - name: cut-node
    gpus: [{model: L4}]
    processes:
      - {gpu: 0, memory_mib: 1000, load: {constant: 42},
         pod: {namespace: ns, name: w-0, container: c}}
"""


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True)


@pytest.fixture
def netns() -> Iterator[tuple[str, str, str]]:
    tag = f"{os.getpid() % 10000}"
    ns, host_if, ns_if = f"gs-cut-{tag}", f"gsh{tag}", f"gsn{tag}"
    octet = 1 + os.getpid() % 250
    host_ip, ns_ip = f"10.231.{octet}.1", f"10.231.{octet}.2"
    sh("ip", "netns", "add", ns)
    try:
        sh("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        sh("ip", "link", "set", ns_if, "netns", ns)
        sh("ip", "addr", "add", f"{host_ip}/30", "dev", host_if)
        sh("ip", "link", "set", host_if, "up")
        sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{ns_ip}/30", "dev", ns_if)
        sh("ip", "netns", "exec", ns, "ip", "link", "set", ns_if, "up")
        sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        yield ns, host_if, ns_ip
    finally:
        subprocess.run(["ip", "link", "del", host_if], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


@pytest.fixture
def agent_in_netns(netns: tuple[str, str, str], tmp_path: Path) -> Iterator[tuple[str, str]]:
    """An agent on a simulated node inside the namespace: (host-side link, agent IP)."""
    ns, host_if, ns_ip = netns
    scenario = tmp_path / "s.yaml"
    scenario.write_text(SCENARIO)
    agent = subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, "-m", "gpuscale.cli", "agent",
         "--gpu-backend", "sim", "--scenario", str(scenario), "--host", ns_ip, "--port", "0",
         "--stream-port", "9401", "--stream-insecure", "--interval", "0.5"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert agent.stdout is not None
    assert "gpuscale agent" in agent.stdout.readline()
    try:
        yield host_if, ns_ip
    finally:
        agent.terminate()
        agent.wait(10)


async def test_cut_link_makes_the_workload_unavailable_then_recovers(
        agent_in_netns: tuple[str, str]) -> None:
    host_if, ns_ip = agent_in_netns
    fleet = FleetView()
    sub = AgentSubscriber(fleet, "test")
    sub.set_addresses([f"{ns_ip}:9401"])
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
        sh("ip", "link", "set", host_if, "down")  # traffic dropped, nothing closed
        await until(reads(str), 10, what="an UNAVAILABLE reason")
        assert "stale" in str(value())
        sh("ip", "link", "set", host_if, "up")
        # keepalive or inactivity timeout, then a fresh stream
        await until(reads(42.0), 40, what="value 42")
    finally:
        await sub.close()
