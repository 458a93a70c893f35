"""The real control plane as a test peer: one cluster for the whole ``cluster`` stage,
built from the wrapper modules (``cluster/build``: cached, minutes when cold) and started
in a network namespace of its own (slot 1, so a ``./dev cluster`` beside it is untouched).
Tests read replica counts from the real API with the real kubectl."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cluster.layout import Layout

REPO = Path(__file__).resolve().parents[2]
SLOT = 1


@dataclass(frozen=True)
class Cluster:
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


def _build() -> Path:
    done = subprocess.run([str(REPO / "cluster" / "build")], capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"cluster/build failed:\n{done.stderr[-3000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    bin_dir = _build()
    root = tmp_path_factory.mktemp("cluster")
    layout = Layout(root, SLOT)
    cmd = [sys.executable, "-m", "cluster"]
    subprocess.run([*cmd, "stop", f"--root={root}", f"--slot={SLOT}"], cwd=REPO, check=False)
    up = subprocess.run([*cmd, "up", f"--root={root}", f"--slot={SLOT}", f"--bin={bin_dir}"],
                        cwd=REPO, capture_output=True, text=True, check=False)
    if up.returncode != 0:
        raise RuntimeError(f"the cluster did not start:\n{up.stderr[-4000:]}")
    try:
        yield Cluster(layout, bin_dir)
    finally:
        subprocess.run([*cmd, "stop", f"--root={root}", f"--slot={SLOT}"], cwd=REPO,
                       check=False)
