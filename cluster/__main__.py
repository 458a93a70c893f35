"""``python -m cluster up|stop|status`` (``./dev cluster`` runs it); ``serve`` is the part
that runs inside the namespace."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from cluster import netns
from cluster.layout import Layout
from cluster.supervisor import read_state, write_state

REPO = Path(__file__).resolve().parent.parent


def _alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def up(layout: Layout, bin_dir: Path, timeout: float, sample: bool = True) -> int:
    state = read_state(layout)
    if netns.exists(layout) or _alive(state.get("supervisor")):
        print(f"cluster: a cluster is already running in {layout.netns} (kubeconfig "
              f"{layout.kubeconfig}); `./dev cluster stop` ends it", file=sys.stderr)
        return 1
    for sub in ("etcd", "pki", "logs", "keda-certs"):
        shutil.rmtree(layout.root / sub, ignore_errors=True)
    layout.logs.mkdir(parents=True, exist_ok=True)
    write_state(layout, {"phase": "starting", "step": "network namespace", "at": time.time()})
    try:
        netns.create(layout)
    except netns.NetnsError as e:
        print(f"cluster: {e}", file=sys.stderr)
        return 1
    argv = netns.enter(layout, [sys.executable, "-m", "cluster", "serve",
                                f"--root={layout.root}", f"--slot={layout.slot}",
                                f"--bin={bin_dir}", *([] if sample else ["--no-sample"])])
    with (layout.logs / "supervisor.log").open("ab") as log:
        proc = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    state = read_state(layout)
    state.update({"supervisor": proc.pid, "netns": layout.netns, "started": time.time()})
    write_state(layout, state)
    return _follow(layout, proc, timeout)


def _follow(layout: Layout, proc: subprocess.Popen[bytes], timeout: float) -> int:
    deadline, shown, start = time.monotonic() + timeout, "", time.monotonic()
    while time.monotonic() < deadline:
        state = read_state(layout)
        phase, text = str(state.get("phase", "")), str(state.get("step", ""))
        if text != shown and phase == "starting":
            print(f"cluster: [{time.monotonic() - start:5.1f} s] {text}", file=sys.stderr)
            shown = text
        if phase == "ready":
            print(f"cluster: ready in {time.monotonic() - start:.0f} s", file=sys.stderr)
            return 0
        if phase == "failed" or proc.poll() is not None:
            why = text if phase == "failed" else (
                f"the launcher exited ({_exit_status(proc.returncode)}) during: {text}")
            print(f"cluster: the start failed: {why}\n(logs: {layout.logs})", file=sys.stderr)
            stop(layout, quiet=True)
            return 1
        time.sleep(0.3)
    print(f"cluster: not ready after {timeout:.0f} s (last step: {shown}; logs: "
          f"{layout.logs}); stopping it", file=sys.stderr)
    stop(layout, quiet=True)
    return 1


def _exit_status(code: int | None) -> str:
    """A launcher's end in words: killed by a signal (someone's kill, the OOM killer) or
    its exit code (its traceback is then at the end of logs/supervisor.log)."""
    if code is not None and code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}; its last lines are in logs/supervisor.log"


def stop(layout: Layout, quiet: bool = False) -> int:
    state = read_state(layout)
    sup = state.get("supervisor")
    if not netns.exists(layout) and not _alive(sup):
        if not quiet:
            print(f"cluster: no cluster is running ({layout.netns}); nothing to stop",
                  file=sys.stderr)
        return 0
    if isinstance(sup, int) and _alive(sup):
        os.killpg(sup, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while _alive(sup) and time.monotonic() < deadline:
            _reap(sup)
            time.sleep(0.2)
    left = _kill_namespace(layout)
    netns.delete(layout)
    # Its address is gone with the namespace: a kubectl left pointing at it would dial
    # through the host's default route instead.
    layout.kubeconfig.unlink(missing_ok=True)
    write_state(layout, {"phase": "stopped", "step": "stopped", "at": time.time()})
    if not quiet:
        extra = f" ({left} killed after the grace period)" if left else ""
        print(f"cluster: stopped{extra}", file=sys.stderr)
    return 0


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def _kill_namespace(layout: Layout) -> int:
    """SIGKILL to whatever still runs in the namespace; how many there were."""
    if not netns.exists(layout):
        return 0
    out = subprocess.run(["ip", "netns", "pids", layout.netns], capture_output=True,
                         text=True, check=False).stdout.split()
    for pid in out:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    return len(out)


def load(layout: Layout, workload: str, in_flight: str) -> int:
    """Sets a workload's requests in flight (``load.json``, read by the pod runner)."""
    try:
        n = int(in_flight)
    except ValueError:
        n = -1
    if "/" not in workload or n < 0:
        print("cluster: load NAMESPACE/APP IN_FLIGHT (the pods' app label; a whole "
              f"number >= 0), not {workload!r} {in_flight!r}", file=sys.stderr)
        return 2
    path = layout.root / "load.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    data = {**(data if isinstance(data, dict) else {}), workload: n}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="cluster")
    p.add_argument("command", choices=["up", "stop", "status", "serve", "load"])
    p.add_argument("rest", nargs="*", help="load: NAMESPACE/APP IN_FLIGHT")
    p.add_argument("--root", type=Path, default=REPO / ".cluster")
    p.add_argument("--slot", type=int, default=0)
    p.add_argument("--bin", type=Path, default=None)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--no-sample", action="store_true",
                   help="up: leave deploy/examples/vllm.yaml out (the tests do)")
    args = p.parse_args(argv)
    layout = Layout(args.root.resolve(), args.slot)
    layout.root.mkdir(parents=True, exist_ok=True)
    if args.command == "stop":
        return stop(layout)
    if args.command == "load":
        if len(args.rest) != 2:
            p.error("load NAMESPACE/APP IN_FLIGHT")
        return load(layout, args.rest[0], args.rest[1])
    if args.command == "status":
        state = read_state(layout)
        print(f"{state.get('phase', 'stopped')}: {state.get('step', '')}")
        return 0 if state.get("phase") == "ready" else 1
    if args.bin is None:
        p.error("--bin: the directory cluster/build printed")
    if args.command == "serve":
        from cluster.serve import serve

        return serve(layout, args.bin.resolve(), sample=not args.no_sample)
    return up(layout, args.bin.resolve(), args.timeout, sample=not args.no_sample)


if __name__ == "__main__":
    sys.exit(main())
