"""Scenario 6: the same scripted load through the models of KEDA and the HPA and through
the real ones. The HPA's sync phase differs from run to run, so the trajectories are
compared by the counts they pass through (``levels``), not second by second."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from cluster.compare import Step, model_trajectory, real_trajectory, table
from cluster.session import Cluster
from tests.cluster.workloads import NAMESPACE, inference_deployment, namespace, scaled_object

pytestmark = pytest.mark.cluster


def levels(trajectory: list[int]) -> list[int]:
    return [k for k, _ in itertools.groupby(trajectory)]


@pytest.mark.parametrize(("behavior", "script", "duration"), [
    # No behavior (the README's minimal ScaledObject): KEDA passes none, and the HPA
    # limits a scale-up to max(2 x current, 4) per sync - 1 -> 4 -> 5, not 1 -> 5.
    (False, (Step(0, 40),), 100),
    # scaleDown window 0 (what the planner's ScaledObjects set): up in one sync (the
    # default scale-up policies allow +4 or +100 %), down as soon as the load is gone.
    (True, (Step(0, 40), Step(70, 8)), 150),
], ids=["no-behavior", "scale-down-window-0"])
def test_the_models_pass_through_the_counts_the_real_loop_does(
        cluster: Cluster, behavior: bool, script: tuple[Step, ...], duration: float) -> None:
    name = f"mvr-{'b' if behavior else 'n'}"
    so = scaled_object(name, name)
    spec: dict[str, Any] = so["spec"]
    if not behavior:
        del spec["advanced"]
    cluster.apply(namespace(), inference_deployment(name))
    cluster.apply(so)
    cluster.kubectl("wait", "--for=condition=Ready", f"scaledobject/{name}", "-n", NAMESPACE,
                    "--timeout=60s")
    real = real_trajectory(lambda n: cluster.load(f"{NAMESPACE}/{name}", n),
                           lambda: cluster.replicas(NAMESPACE, name), script, duration)
    model = model_trajectory(spec, 8.0, script, duration)
    print(table(script, model, real))
    assert levels(model) == levels(real), table(script, model, real)
    cluster.kubectl("delete", "scaledobject,deployment", name, "-n", NAMESPACE)
