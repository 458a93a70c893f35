"""What /proc says of a process: its CPU seconds and its memory (shared by the benches)."""

from __future__ import annotations

import os
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


def proc_mem_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of ``pid`` in MiB."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS", "VmHWM")):
            key, val = line.split(":")
            values[key] = int(val.split()[0]) / 1024
    return values["VmRSS"], values["VmHWM"]
