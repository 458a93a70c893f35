"""A scenario file that a running simulation follows: read again whenever it changes.

The cluster launcher's stand-in kubelet rewrites a node's scenario while the agent runs (one
process per pod container, with the pod's load); the simulated backend calls ``poll`` once
per sample, which costs one ``os.stat`` while the file stays the same.

A reload changes the node's processes only. The GPUs stay those the simulation started with
(their UUIDs, MIG layouts and energy counters carry on): a file that changes them is used for
the processes that fit the GPUs kept, with a warning naming the change. A file that is
missing, unreadable, oversized or not a valid scenario keeps the last good processes: bad
input loses nothing. Each distinct problem is logged once, not once per sample.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

from gpuscale.telemetry.scenario import (
    GpuSpec,
    NodeSpec,
    ScenarioError,
    fit_processes,
    load_scenario,
    parse_scenario,
    read_scenario_document,
)

log = logging.getLogger(__name__)

# One version of the file: a rename over it changes the inode, a write in place its size or
# modification time.
_Version = tuple[int, int, int, int]


class ScenarioFile:
    """One node of a scenario file, followed. ``node`` is that node as last read well.

    Raises ScenarioError when the file cannot be used at start (as ``load_scenario``);
    ``node_name`` None takes the first node, and reloads then follow that node by name.
    """

    def __init__(self, path: Path, node_name: str | None = None,
                 stat: Callable[[Path], os.stat_result] = os.stat) -> None:
        self.path = path
        self._stat = stat
        self._said: dict[str, str] = {}  # kind of problem -> the message logged for it
        try:
            self._seen: _Version | None = self._version()  # before the read: a write
        except OSError:                                    # during it shows next poll
            self._seen = None
        self.node = load_scenario(path).node(node_name)

    def poll(self) -> NodeSpec | None:
        """The node with the file's processes when the file changed since the last poll and
        reads well; else None (unchanged, or a problem logged and the last good node kept).
        Blocks on one ``stat``, and on reading the file when it changed."""
        try:
            version = self._version()
        except OSError as exc:
            self._seen = None  # whatever comes back at this path is read
            self._say("file", f"cannot read ({exc.strerror or exc}); keeping the last good "
                              "scenario")
            return None
        if version == self._seen:
            return None
        self._seen = version
        try:
            data = read_scenario_document(self.path)
            new = parse_scenario(data, self.path.parent).node(self.node.name)
        except (OSError, ScenarioError) as exc:
            why = f"cannot read ({exc.strerror or exc})" if isinstance(exc, OSError) else \
                str(exc).removeprefix(f"{self.path}: ")
            self._say("file", f"{why}; keeping the last good scenario")
            return None
        if self._said.pop("file", None) is not None:
            log.info("scenario %s: read again", self.path)
        processes = new.processes
        if new.gpus == self.node.gpus:
            self._said.pop("gpus", None)
            self._said.pop("fit", None)
        else:
            self._say("gpus", f"the GPUs changed ({gpu_changes(self.node.gpus, new.gpus)}); "
                              "keeping those it started with and the processes that fit them")
            processes, problems = fit_processes(data, new.name, self.node.gpus,
                                                self.path.parent)
            if problems:
                more = f"; and {len(problems) - 3} more" if len(problems) > 3 else ""
                self._say("fit", f"left out {len(problems)} process(es) that do not fit its "
                                 f"GPUs: {'; '.join(problems[:3])}{more}")
            else:
                self._said.pop("fit", None)
        self.node = NodeSpec(self.node.name, self.node.gpus, processes)
        log.debug("scenario %s: %d processes", self.path, len(processes))
        return self.node

    def _version(self) -> _Version:
        st = self._stat(self.path)
        return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns

    def _say(self, kind: str, message: str) -> None:
        message = " ".join(message.split())  # one line (YAML errors span several)
        if self._said.get(kind) != message:
            log.warning("scenario %s: %s", self.path, message)
        self._said[kind] = message


def gpu_changes(old: tuple[GpuSpec, ...], new: tuple[GpuSpec, ...]) -> str:
    """What differs between two GPU lists, for a person (the first few differences)."""
    parts = [f"{len(old)} GPUs -> {len(new)}"] if len(old) != len(new) else []
    for a, b in zip(old, new, strict=False):
        if a.model != b.model:
            parts.append(f"GPU {a.index} model {a.model.key} -> {b.model.key}")
        if a.sharing != b.sharing:
            parts.append(f"GPU {a.index} sharing {a.sharing.value} -> {b.sharing.value}")
        elif a.mig != b.mig:
            parts.append(f"GPU {a.index} MIG {[p.name for p in a.mig]} -> "
                         f"{[p.name for p in b.mig]}")
    more = f"; and {len(parts) - 3} more" if len(parts) > 3 else ""
    return "; ".join(parts[:3]) + more
