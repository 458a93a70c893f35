"""One running cluster seen from outside: the real kubectl against it, the load file,
and starting or stopping a cluster of its own (the test suite's, a bench's)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster.layout import Layout

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Cluster:
    """kubectl, apply and the load file of one running cluster."""

    layout: Layout
    bin_dir: Path

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        done = subprocess.run(
            [str(self.bin_dir / "kubectl"), f"--kubeconfig={self.layout.kubeconfig}", *args],
            input=stdin, capture_output=True, text=True, check=False, timeout=60)
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def get(self, *args: str) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(self.kubectl("get", *args, "-o", "json"))
        return out

    def apply(self, *objects: dict[str, Any]) -> None:
        body = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)})
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=body)

    def load(self, workload: str, in_flight: int) -> None:
        path = self.layout.root / "load.json"
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            data = {}
        data[workload] = in_flight
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)

    def replicas(self, namespace: str, deployment: str) -> int:
        return int(self.get("deployment", deployment, "-n", namespace)["spec"]["replicas"])


def build() -> Path:
    """The binaries' directory (``cluster/build``: cached; minutes when cold)."""
    done = subprocess.run([str(REPO / "cluster" / "build")], capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"cluster/build failed:\n{done.stderr[-3000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


@contextmanager
def running(root: Path, slot: int) -> Iterator[Cluster]:
    """A cluster of its own in ``root`` (namespace slot ``slot``), stopped afterwards."""
    bin_dir = build()
    cmd = [sys.executable, "-m", "cluster"]
    where = [f"--root={root}", f"--slot={slot}"]
    subprocess.run([*cmd, "stop", *where], cwd=REPO, check=False)
    up = subprocess.run([*cmd, "up", *where, f"--bin={bin_dir}", "--no-sample"], cwd=REPO,
                        capture_output=True, text=True, check=False)
    if up.returncode != 0:
        raise RuntimeError(f"the cluster did not start:\n{up.stderr[-4000:]}")
    try:
        yield Cluster(Layout(root, slot), bin_dir)
    finally:
        subprocess.run([*cmd, "stop", *where], cwd=REPO, check=False)
