"""Model vs real: scripted loads through gpuscale's models of KEDA and the HPA and through
the real KEDA 2.21 and kube-controller-manager 1.37 (a cluster of its own, slot 3), the
replica trajectories side by side, every 5 s. Takes about 12 minutes of real time.

    .venv/bin/python bench/bench_model_vs_real.py [--only NAME]

Needs root and Go (the cluster; ``cluster/build`` first if it is cold)."""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cluster.compare import Step, model_trajectory, real_trajectory, table
from cluster.session import running
from tests.cluster.workloads import (
    NAMESPACE,
    inference_deployment,
    namespace,
    scaled_object,
)

WINDOW_0 = {"horizontalPodAutoscalerConfig": {"behavior": {
    "scaleDown": {"stabilizationWindowSeconds": 0}}}}
RUNS: dict[str, tuple[dict[str, Any] | None, tuple[Step, ...], float]] = {
    # The README's minimal ScaledObject: no behavior; up 1 -> 4 -> 8, down after 5 min.
    "no-behavior": (None, (Step(0, 64), Step(90, 8)), 480),
    # scaleDown window 0: up, part way down, up again, to the minimum.
    "window-0": (WINDOW_0, (Step(0, 40), Step(75, 16), Step(150, 56), Step(225, 0)), 300),
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=sorted(RUNS))
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="gs-mvr-") as root, \
            running(Path(root), 3) as cluster:
        for name, (advanced, script, duration) in RUNS.items():
            if args.only and name != args.only:
                continue
            so = scaled_object(name, name)
            if advanced is None:
                del so["spec"]["advanced"]
            cluster.apply(namespace(), inference_deployment(name))
            cluster.apply(so)
            cluster.kubectl("wait", "--for=condition=Ready", f"scaledobject/{name}", "-n",
                            NAMESPACE, "--timeout=60s")
            real = real_trajectory(partial(cluster.load, f"{NAMESPACE}/{name}"),
                                   partial(cluster.replicas, NAMESPACE, name),
                                   script, duration)
            model = model_trajectory(so["spec"], 8.0, script, duration)
            same = [k for k, _ in itertools.groupby(model)] == [
                k for k, _ in itertools.groupby(real)]
            print(f"\n### {name}: levels {'the same' if same else 'DIFFER'}; replica-seconds "
                  f"model {5 * sum(model)}, real {5 * sum(real)}\n")
            print(table(script, model, real))
            cluster.kubectl("delete", "scaledobject,deployment", name, "-n", NAMESPACE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
