"""``gpuscale`` commands run as child processes: one that says when it is up (``Proc``),
the ``demo --scenario`` scaler the ``scenario_scaler`` fixture shares, and a demo that
records history for ``gpuscale idle`` (``HistoryDemo``)."""

from __future__ import annotations

import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from gpuscale.telemetry.scenario import load_scenario
from tests.support.polling import until_sync
from tests.support.ports import free_port


def stop(p: subprocess.Popen[str]) -> None:
    """End ``p`` (resumed first if a test stopped it): SIGTERM, then SIGKILL after 10 s."""
    if p.poll() is None:
        p.send_signal(signal.SIGCONT)
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


class Proc:
    """``gpuscale ARGS`` in a child process, up once one of its first lines of output
    holds ``ready`` (what the command prints when it listens)."""

    def __init__(self, *args: str, ready: str = "gpuscale") -> None:
        self.args = args
        self.ready = ready
        self.p = self._start()

    def _start(self) -> subprocess.Popen[str]:
        p = subprocess.Popen([sys.executable, "-m", "gpuscale.cli", *self.args],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert p.stdout is not None
        lines = [p.stdout.readline()]
        while self.ready not in lines[-1] and lines[-1] and len(lines) < 20:
            lines.append(p.stdout.readline())
        assert self.ready in lines[-1], lines
        return p

    def restart(self) -> None:
        self.stop()
        self.start()

    def start(self) -> None:
        """Start it again after ``stop``, returning once it has said it is up."""
        self.p = self._start()

    def stop(self) -> None:
        stop(self.p)


def inspect_fleet(address: str) -> Any:
    """The Fleet reply of the scaler at ``address`` (ToolError when it does not answer)."""
    from gpuscale.tools.client import InspectClient, Target

    with InspectClient(Target(address), timeout_s=5.0) as client:
        return client.fleet()


def start_scenario_scaler(port: int, scenario: str = "mig-node") -> Proc:
    """``gpuscale demo --scenario`` serving its scaler on 127.0.0.1:``port``, returned
    once the scaler's fleet view holds the scenario's pods."""
    from gpuscale.tools.client import ToolError

    proc = Proc("demo", "--scenario", scenario, "--host", "127.0.0.1", "--port", str(port),
                "--metrics-port", "0", "--interval", "0.5", ready="KEDA external scaler on")
    try:
        until_sync(lambda: inspect_fleet(f"127.0.0.1:{port}").pods, 15.0,
                   f"the {scenario} pods at the scaler", tolerate=(ToolError,))
    except BaseException:
        proc.stop()
        raise
    return proc


@dataclass(frozen=True)
class Served:
    address: str  # host:port
    proc: Proc    # stop() and start() it again on the same port


class HistoryDemo:
    """``gpuscale demo --scenario`` on a free port whose scaler records its history every
    ``history_step`` seconds (not 15: ``gpuscale idle`` tests see minutes fill at once);
    ``metrics`` are its agents' /metrics URLs by node, ``streams`` their telemetry streams.
    Stop it with ``stop()``."""

    def __init__(self, scenario: str, history_step: float = 0.5, interval: float = 0.5) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.p = subprocess.Popen(
            [sys.executable, "-m", "gpuscale.cli", "demo", "--scenario", scenario, "--host",
             "127.0.0.1", "--port", str(self.port), "--metrics-port", "0", "--interval",
             str(interval), "--history-step", str(history_step)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert self.p.stdout is not None
        self.metrics: dict[str, str] = {}
        self.streams: dict[str, str] = {}  # the agents' telemetry streams (host:port)
        nodes = len(load_scenario(scenario).nodes)
        up = False
        while not up or len(self.metrics) < nodes:
            line = self.p.stdout.readline()
            if not line:
                self.stop()
                raise AssertionError(f"the demo ended before it was up: {self.p.returncode}")
            up = up or line.startswith("KEDA external scaler on")
            if line.startswith("agent ") and "metrics at " in line:
                node = line.split()[1].rstrip(":")
                self.metrics[node] = line.split("metrics at ")[1].split(";")[0].strip()
                self.streams[node] = line.split("gpuscale gpus --agent ")[1].strip()

    def stop(self) -> None:
        stop(self.p)
