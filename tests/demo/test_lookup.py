"""What the demo prints can be looked up in its scaler: a decision line's wall-clock time
with ``explain --at``, and the banner's explain command works as printed (with the bounds
its scaler cannot see). Real demo processes, the real commands."""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime

import pytest

from gpuscale.demo.loop import HISTORY_MIN_STEP_S, history_step
from gpuscale.demo.view import Decision
from gpuscale.scaler.state.history import KEEP_S, STEP_S
from tests.demo.test_loop import DECISION, DEMO
from tests.support.ports import free_port

GPUSCALE = [sys.executable, "-m", "gpuscale.cli"]


def run_printed(command: str) -> subprocess.CompletedProcess[str]:
    """A ``gpuscale ...`` command exactly as the demo printed it."""
    words = shlex.split(command)
    assert words[0] == "gpuscale", command
    return subprocess.run([*GPUSCALE, *words[1:]], capture_output=True, text=True,
                          timeout=60, check=False)


def test_a_decision_says_its_simulated_and_its_wall_clock_time() -> None:
    wall = datetime(2026, 11, 28, 3, 41, 6, 600_000, tzinfo=UTC).timestamp()
    assert Decision(2530.0, 2, 3, "KEDA: x", wall).when() == "00:42:10 sim (03:41:07 UTC)"
    assert Decision(2530.0, 2, 3, "KEDA: x").when() == "00:42:10"  # no wall time known


@pytest.mark.parametrize(("speed", "step"), [
    (1.0, STEP_S),  # real time: KEDA's polling interval, the scaler's default
    (0.5, STEP_S),  # slow motion: never rarer than the default
    (40.0, 0.75),  # ./dev run: 30 simulated s
    (1000.0, HISTORY_MIN_STEP_S),  # the fastest: floored, half a printed second
])
def test_the_demos_history_step_is_kedas_polling_in_simulated_time(
        speed: float, step: float) -> None:
    assert history_step(speed) == step
    # The history keeps a fixed number of moments per workload: bounded at every speed.
    assert KEEP_S / history_step(speed) <= KEEP_S / HISTORY_MIN_STEP_S == 7200


@pytest.mark.slow
def test_a_decision_the_demo_printed_is_explained_at_its_printed_time() -> None:
    port = free_port()
    proc = subprocess.Popen([*DEMO, "--port", str(port), "--pattern", "bursts",
                             "--duration", "1800", "--speed", "30"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        banner = [proc.stdout.readline() for _ in range(3)]
        printed = re.search(r"why this count: (gpuscale explain [^;]+);", banner[2])
        assert printed, banner
        # The banner's command, as printed: the demo's bounds, not KEDA's defaults.
        got = run_printed(printed[1])
        assert got.returncode == 0, got.stderr
        assert "clamped to min 1, max 16 (given with --min-replicas" in got.stdout, got.stdout
        assert "KEDA's defaults" not in got.stdout
        deadline = time.monotonic() + 90
        for line in proc.stdout:
            decision = DECISION.match(line)
            if decision:
                break
            assert time.monotonic() < deadline, "no decision printed"
        else:
            raise AssertionError("the demo ended without a decision")
        utc = decision[2]
        # The scaler records the moment a second or two after the demo prints it (its
        # history is written as KEDA asks): a second printed just now may not be kept
        # yet - "after it" - and is, once the next KEDA call has come.
        for _ in range(20):
            got = run_printed(f"{printed[1]} --at {utc} --json")
            if got.returncode == 0 or "after it" not in got.stderr:
                break
            time.sleep(0.5)
        assert got.returncode == 0, got.stderr
        reply = json.loads(got.stdout)
        recorded = time.strftime("%H:%M:%S", time.gmtime(float(reply["at"])))
        # The moment recorded nearest the printed second: the scaler records every 30
        # simulated seconds (1 wall second at x30), not every 30 wall seconds (15
        # simulated minutes), which would have answered with a moment long before.
        apart = abs(_seconds(recorded) - _seconds(utc))
        assert min(apart, 86_400 - apart) <= 2, (utc, recorded)
        assert reply["name"] == "vllm-demo"
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    assert "Traceback" not in err


def _seconds(clock: str) -> int:
    h, m, s = (int(x) for x in clock.split(":"))
    return h * 3600 + m * 60 + s
