"""What /proc says of a process: its CPU seconds and its memory (shared by the benches)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def child_env(*first: Path) -> dict[str, str]:
    """This environment for a bench's child process: ``first`` folders, then the source
    tree, then whatever PYTHONPATH already held (a device run's own dependencies)."""
    path = [str(p) for p in (*first, REPO / "src")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        [*path, *filter(None, [os.environ.get("PYTHONPATH")])])}


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    """The processes ``pid`` started (the scaler's gRPC front with --answer-process)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            out += [int(c) for c in (task / "children").read_text().split()]
    return out


def proc_mem_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of ``pid`` in MiB."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS", "VmHWM")):
            key, val = line.split(":")
            values[key] = int(val.split()[0]) / 1024
    return values["VmRSS"], values["VmHWM"]


def measure_agent(command: Sequence[str], env: dict[str, str], duration: float) -> str:
    """Start ``gpuscale agent`` (``command``: its arguments after ``agent``; it must print
    "serving metrics at URL"), let it warm up 5 s, then scrape its /metrics every 15 s for
    ``duration`` seconds; the line the agent benches print: CPU and RSS over that time."""
    agent = subprocess.Popen(
        [sys.executable, "-m", "gpuscale.cli", "--log-level", "WARNING", "agent", *command],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert agent.stdout is not None
        line = agent.stdout.readline()
        if "serving metrics at " not in line:
            sys.exit(f"agent did not start: {line}{agent.stderr.read() if agent.stderr else ''}")
        url = line.split("at ")[1].split()[0]
        time.sleep(5)  # warm up: imports done, first samples taken
        cpu0, t0 = proc_cpu_seconds(agent.pid), time.monotonic()
        next_scrape, scrapes, size = t0, 0, 0
        while time.monotonic() - t0 < duration:
            if time.monotonic() >= next_scrape:
                with urllib.request.urlopen(url, timeout=5) as resp:
                    size = len(resp.read())
                scrapes += 1
                next_scrape += 15.0
            time.sleep(0.2)
        cpu = proc_cpu_seconds(agent.pid) - cpu0
        elapsed = time.monotonic() - t0
        rss, hwm = proc_mem_mib(agent.pid)
    finally:
        agent.terminate()
        agent.wait(timeout=10)
    return (f"agent at 1 Hz for {elapsed:.0f} s with {scrapes} scrapes ({size / 1024:.0f} "
            f"KiB each): CPU {100 * cpu / elapsed:.2f} % of one core; RSS {rss:.1f} MiB "
            f"(peak {hwm:.1f} MiB)")
