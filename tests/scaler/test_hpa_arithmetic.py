"""The value KEDA gets, through the HPA's formulas: desired replicas follow the load.

A load of L GPU-percent (L/100 GPUs' worth of kernels) spread over r pods, each capped at
100 %; target T per pod. AverageValue: desired = ceil(value / T) (KEDA's default); Value:
desired = ceil(ready * value / T), with the HPA's count of Ready pods (replica_calculator's
getUsageRatioReplicaCount), not the replica count. Within 10 % of the current ratio the HPA
keeps r. The cap is
why scale-out from one pod takes several steps: a saturated pod reads 100, so each step can
grow the count by at most 100/T.
"""

from __future__ import annotations

import math

import pytest

from gpuscale.scaler.core.aggregate import evaluate
from gpuscale.scaler.core.profiles import Target, ValueMode
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.stream.records import PodRecord

TOLERANCE = 0.1


def fleet_with(load: float, replicas: int,
               unready: int = 0) -> tuple[FleetView, list[PodRecord]]:
    """``replicas`` pods sharing ``load``; the last ``unready`` of them are not Ready (a
    readiness probe failing under load) but still report and carry their share."""
    fleet = FleetView(monotonic=lambda: 0.0)
    per_pod = min(100.0, load / replicas)
    pods = [PodRecord("ns", f"p{i}", "n", {"app": "x"}, None, i < replicas - unready,
                      {"gpu-utilization": per_pod}, 0.0) for i in range(replicas)]
    fleet.update_node("n", pods)
    return fleet, pods


def hpa(replicas: int, ready: int, value: float, target: float, metric_type: str) -> int:
    """The HPA's external-metric step (k8s podautoscaler replica_calculator:
    GetExternalMetricReplicas / GetExternalPerPodMetricReplicas)."""
    if metric_type == "AverageValue":
        usage_ratio = value / (target * replicas)
        desired = math.ceil(value / target)
    else:
        usage_ratio = value / target
        desired = math.ceil(ready * usage_ratio)
    if abs(usage_ratio - 1.0) <= TOLERANCE:
        return replicas
    return max(desired, 1)


def settled_at_target(history: list[int], load: float, target: float) -> bool:
    """Settled (no oscillation) on ceil(L/T) pods, or on a count the HPA's 10 % tolerance
    band keeps (1000/80 = 12.5 -> 12 pods run at 104 % of target: within tolerance)."""
    final = history[-1]
    in_band = abs(load / (target * final) - 1.0) <= TOLERANCE
    return len(set(history[-6:])) == 1 and (final == math.ceil(load / target) or in_band)


def run_loop(load: float, target: float, mode: str, metric_type: str,
             start: int = 1, steps: int = 24, unready: int = 0) -> list[int]:
    replicas, history = start, []
    for _ in range(steps):
        down = min(unready, replicas - 1)
        fleet, pods = fleet_with(load, replicas, down)
        value = evaluate(fleet, pods, Target("gpu-utilization", target, 0.0),
                         ValueMode(mode)).value
        replicas = hpa(replicas, replicas - down, value, target, metric_type)
        history.append(replicas)
    return history


@pytest.mark.parametrize(("load", "target"), [(350.0, 70.0), (1000.0, 80.0), (90.0, 60.0),
                                              (2400.0, 75.0)])
def test_sum_under_average_value_reaches_ceil_load_over_target_and_stays(
        load: float, target: float) -> None:
    history = run_loop(load, target, "sum", "AverageValue")
    assert settled_at_target(history, load, target)


@pytest.mark.parametrize(("load", "target"), [(350.0, 70.0), (1000.0, 80.0)])
def test_average_under_value_reaches_the_same_count(load: float, target: float) -> None:
    history = run_loop(load, target, "average", "Value")
    assert settled_at_target(history, load, target)


@pytest.mark.parametrize("unready", [1, 2])
def test_value_mode_divides_by_ready_pods_so_unready_load_still_counts(unready: int) -> None:
    """Pods that report but are not Ready: the HPA multiplies by its Ready count, so the
    value is the whole load over the Ready pods. Averaging over every reporting pod would
    hand the HPA ready x (L / r) < L and hold the fleet short of ceil(L / T)."""
    load, target = 350.0, 70.0
    fleet, pods = fleet_with(load, 5, unready)
    value = evaluate(fleet, pods, Target("gpu-utilization", target, 0.0),
                     ValueMode.AVERAGE).value
    assert value == pytest.approx(load / (5 - unready))
    assert math.ceil((5 - unready) * value / target) == math.ceil(load / target)
    history = run_loop(load, target, "average", "Value", start=3, unready=unready)
    assert min(history[-6:]) >= math.ceil(load / target)


@pytest.mark.parametrize(("load", "target"), [(1000.0, 70.0), (2400.0, 80.0)])
def test_an_average_under_average_value_cannot_scale_a_loaded_fleet_out(
        load: float, target: float) -> None:
    """What a per-node or averaging scaler does: ceil(u / T) <= 2 whatever the load."""
    history = run_loop(load, target, "average", "AverageValue")
    assert max(history) <= 2
    assert history[-1] < math.ceil(load / target)


def test_the_same_holds_when_replicas_change_underneath() -> None:
    """Start over-provisioned: sum keeps asking for ceil(L/T), not more, not less."""
    for start in (1, 3, 10, 25):
        assert run_loop(700.0, 70.0, "sum", "AverageValue", start=start)[-1] == 10
