"""Starts the cluster's programs in order, waits for each to answer, and stops them all.

Runs inside the cluster's namespace (``ip netns exec``), so every child is in it too and
127.0.0.1 is the namespace's own loopback. Each program writes ``logs/<name>.log``; a
program that exits while the cluster starts fails the start with the log's last lines."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cluster.layout import Layout


class StartError(RuntimeError):
    pass


def tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


@dataclass
class Supervisor:
    layout: Layout
    children: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, name: str, argv: Sequence[str],
              env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
        if name in self.children and self.children[name].poll() is None:
            raise StartError(f"{name} is already running")
        self.layout.logs.mkdir(parents=True, exist_ok=True)
        log = (self.layout.logs / f"{name}.log").open("ab")
        merged = {**os.environ, **(env or {})}
        try:
            proc = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT,
                                    env=merged, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        except OSError as e:
            raise StartError(f"cannot start {name} ({argv[0]}): {e.strerror}; "
                             f"cluster/build builds the binaries") from e
        finally:
            log.close()
        self.children[name] = proc
        self._record()
        return proc

    def wait_until(self, name: str, ready: Callable[[], bool], timeout: float = 120.0) -> None:
        """Polls ``ready`` until it holds; fails if ``name`` exits or the time runs out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            proc = self.children.get(name)
            if proc is not None and proc.poll() is not None:
                raise StartError(f"{name} exited with {proc.returncode}; "
                                 f"{self.layout.logs / (name + '.log')} ends:\n"
                                 f"{tail(self.layout.logs / (name + '.log'))}")
            if ready():
                return
            time.sleep(0.25)
        raise StartError(f"{name} did not become ready in {timeout:.0f} s; "
                         f"{self.layout.logs / (name + '.log')} ends:\n"
                         f"{tail(self.layout.logs / (name + '.log'))}")

    def exited(self) -> list[str]:
        return [f"{n} (exit {p.returncode})" for n, p in self.children.items()
                if p.poll() is not None]

    def stop_all(self, grace: float = 10.0) -> None:
        """SIGTERM to every child (newest first), SIGKILL to what is left after ``grace``."""
        for proc in reversed(list(self.children.values())):
            _signal(proc, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.children.values():
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal(proc, signal.SIGKILL)
                proc.wait()
        self.children.clear()
        self._record()

    def _record(self) -> None:
        state = read_state(self.layout)
        state["children"] = {n: p.pid for n, p in self.children.items()}
        write_state(self.layout, state)


def _signal(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


def read_state(layout: Layout) -> dict[str, object]:
    try:
        data = json.loads(layout.state_file.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_state(layout: Layout, state: Mapping[str, object]) -> None:
    tmp = layout.state_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1))
    tmp.replace(layout.state_file)


def http_ok(url: str, context: ssl.SSLContext | None = None) -> Callable[[], bool]:
    """A readiness probe: ``url`` answers 200."""
    def probe() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2, context=context) as reply:
                return int(reply.status) == 200
        except (OSError, urllib.error.URLError, ssl.SSLError):
            return False
    return probe


def client_context(ca: Path, cert: Path, key: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.load_cert_chain(str(cert), str(key))
    return ctx
