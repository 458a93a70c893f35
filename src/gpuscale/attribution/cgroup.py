"""PID -> pod: read ``/proc/<pid>/cgroup`` and find the pod UID and container ID in it.

Handles cgroup v1 and v2, the systemd and cgroupfs drivers, and containerd, CRI-O and
Docker naming, e.g.::

    0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice/
        cri-containerd-<id>.scope                                  (v2, systemd, containerd)
    0::/kubepods.slice/kubepods-pod<uid_>.slice/crio-<id>.scope    (v2, systemd, CRI-O)
    12:memory:/kubepods/besteffort/pod<uid>/<id>                   (v1, cgroupfs)
    0::/kubepods/burstable/pod<uid>/<id>                           (v2, cgroupfs)
    1:name=systemd:/kubepods.slice/.../docker-<id>.scope           (v1, systemd, Docker)

The host PIDs NVML reports are visible only when the agent runs with ``hostPID: true``;
``PidResolver.available()`` says whether it does, and why not.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable
from pathlib import Path

from gpuscale.attribution.model import ProcessOwner
from gpuscale.telemetry.model import Absent

MAX_CGROUP_BYTES = 64 * 1024

_POD = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
                  r"(?:\.slice)?$")
_CONTAINER = re.compile(r"(?:(?:cri-containerd|crio|docker|containerd)-)?([0-9a-f]{64})"
                        r"(?:\.scope)?$")


def parse_cgroup(text: str) -> ProcessOwner | None:
    """The pod and container a process belongs to, or None when its cgroup is no pod's.

    The container ID is "" for a process in a pod cgroup but in no container's (e.g. CRI-O's
    conmon). Malformed lines are skipped.
    """
    for path in _paths(text.splitlines()):
        parts = [p for p in path.split("/") if p]
        uid = ""
        container = ""
        for i, part in enumerate(parts):
            m = _POD.search(part)
            if m:
                uid = m[1].replace("_", "-")
                rest = parts[i + 1:]
                if rest and not rest[-1].startswith("crio-conmon-"):
                    c = _CONTAINER.fullmatch(rest[-1])
                    container = c[1] if c else ""
                break
        if uid:
            return ProcessOwner(uid, container)
    return None


def _paths(lines: Iterable[str]) -> Iterable[str]:
    """Cgroup paths, the unified (v2) hierarchy first."""
    unified: list[str] = []
    legacy: list[str] = []
    for line in lines:
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        (unified if fields[0] == "0" and fields[1] == "" else legacy).append(fields[2])
    return [*unified, *legacy]


class PidResolver:
    """Looks PIDs up under a /proc root (a constructor argument so tests use a fixture tree).

    A process never changes pod, so owners are cached per (pid, start time): a tick costs
    one stat per PID, and a reused PID (new start time) is read afresh.
    """

    def __init__(self, proc_root: Path = Path("/proc"),
                 recheck_s: float = 60.0) -> None:
        self._root = proc_root
        self._recheck_s = recheck_s
        self._available: tuple[float, tuple[bool, str]] | None = None
        self._cache: dict[int, tuple[int, ProcessOwner | None]] = {}

    def available(self) -> tuple[bool, str]:
        """Whether host PIDs are visible: PID 1 must be the host's init, not a container's.
        Re-checked every ``recheck_s`` seconds."""
        now = time.monotonic()
        if self._available is None or now - self._available[0] > self._recheck_s:
            self._available = (now, self._check())
        return self._available[1]

    def _check(self) -> tuple[bool, str]:
        try:
            init = (self._root / "1" / "cgroup").read_text(errors="replace")[:MAX_CGROUP_BYTES]
        except OSError as exc:
            return False, f"cannot read {self._root}/1/cgroup ({exc.strerror})"
        if parse_cgroup(init) is not None:
            return False, "hostPID is not enabled (PID 1 is a pod's): per-process " \
                          "attribution of shared GPUs is off"
        return True, "ok"

    def owners(self, pids: Iterable[int]) -> dict[int, ProcessOwner | None] | Absent:
        """Owner of each PID (None: not in a pod, or exited). Absent when PIDs are hidden."""
        ok, _ = self.available()
        if not ok:
            return Absent.UNAVAILABLE
        result: dict[int, ProcessOwner | None] = {}
        cache: dict[int, tuple[int, ProcessOwner | None]] = {}
        root = str(self._root)
        for pid in pids:
            base = f"{root}/{pid}"
            try:
                started = os.stat(base).st_ctime_ns  # /proc/<pid> is made at process start
                hit = self._cache.get(pid)
                if hit is not None and hit[0] == started:
                    owner = hit[1]
                else:
                    with open(f"{base}/cgroup", "rb") as fh:
                        owner = parse_cgroup(fh.read(MAX_CGROUP_BYTES).decode(errors="replace"))
            except OSError:
                result[pid] = None  # exited between the NVML read and now, or not ours
                continue
            cache[pid] = (started, owner)
            result[pid] = owner
        self._cache = cache  # PIDs no longer on a GPU fall out
        return result
