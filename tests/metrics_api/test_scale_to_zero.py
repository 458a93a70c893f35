"""Kubernetes 1.37 scales Object metrics to zero without KEDA (HPAScaleToZero): the
custom-metrics path wakes a workload at zero pods from a demand source. Through the real
server (local mode, HTTPS), a Kubernetes client as the HPA controller's, and the HPA
model's arithmetic at zero replicas."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuscale.common.errors import ConfigError, DataUnavailable, Unavailable
from gpuscale.kube.connect import connect
from gpuscale.kube.errors import ApiError
from gpuscale.metrics_api.answers import MetricAnswers
from gpuscale.metrics_api.local import LocalAccess
from gpuscale.metrics_api.quantity import parse_quantity
from gpuscale.metrics_api.server import MetricsApiServer
from gpuscale.models.hpa import Hpa, Metric, MetricSource, TargetType
from gpuscale.scaler.answers import Answers
from gpuscale.scaler.core.selector import Selector, parse_selector
from gpuscale.scaler.state.fleet import FleetView

PATH = ("/apis/custom.metrics.k8s.io/v1beta2/namespaces/llm/deployments.apps/chat/"
        "gpuscale_demand_pending?metricLabelSelector=demandSource%3Dqueue")


class Chat:
    def target(self, namespace: str, kind: str, name: str) -> Selector | Unavailable | None:
        return parse_selector("app=chat") if (namespace, name) == ("llm", "chat") else None


@dataclass
class Queue:
    """The demand source "queue": pending work, or it cannot tell."""

    pending: bool | None = False

    def __call__(self, name: str) -> bool:
        if name != "queue":
            raise ConfigError(f"demandSource: {name!r} is not declared")
        if self.pending is None:
            raise DataUnavailable("queue: the query timed out")
        return self.pending


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[Queue, Path]]:
    queue = Queue()
    access = LocalAccess.create(tmp_path / "local")
    server = MetricsApiServer(MetricAnswers(Answers(FleetView(), demand=queue), Chat()),
                              None, None, access.cert, access.key, "127.0.0.1", 0,
                              local=access)
    bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(server.serve(bound.set_result))
    kubeconfig = access.write_kubeconfig(await asyncio.wait_for(bound, 10))
    yield queue, kubeconfig
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_an_hpa_at_zero_wakes_on_pending_work_and_holds_when_unknown(
        served: tuple[Queue, Path]) -> None:
    queue, kubeconfig = served
    api = await connect(kubeconfig)
    hpa = Hpa(min_replicas=0, max_replicas=8)  # minReplicas: 0 (HPAScaleToZero)

    async def sync(now: float, current: int) -> int:
        try:
            body = await api.get_raw(PATH)
            value: float | None = float(parse_quantity(body["items"][0]["value"]))
        except ApiError as exc:
            if exc.status != 503:  # 503: the reason, and the HPA keeps its count
                raise
            value = None
        return hpa.step(now, current, [Metric(MetricSource.OBJECT, TargetType.AVERAGE_VALUE,
                                              1.0, value)])

    try:
        assert await sync(0.0, 0) == 0  # no pods, no pending work: stays at zero
        queue.pending = True
        assert await sync(15.0, 0) == 1  # pending work wakes it: ceil(1 / 1)
        queue.pending = None
        assert await sync(30.0, 0) == 0  # cannot tell: no change (a None metric)
        with pytest.raises(ApiError) as unknown:
            await api.get_raw(PATH.replace("queue", "nope"))
        assert unknown.value.status == 400
        with pytest.raises(ApiError) as absent:
            await api.get_raw(PATH.replace("/chat/", "/other/"))
        assert absent.value.status == 404
        with pytest.raises(ApiError) as bare:
            await api.get_raw(PATH.split("?", maxsplit=1)[0])
        assert bare.value.status == 400  # which source: required
    finally:
        await api.close()


def test_the_hpa_arithmetic_at_zero_replicas() -> None:
    """autoscaling/v2 at zero current replicas (replica_calculator.go): an AverageValue
    Object metric's usage ratio is value / (target x 0), infinite for any value above 0,
    so the HPA asks ceil(value / target); a value of 0 leaves it at zero."""
    for value, want in ((0.0, 0), (0.4, 1), (1.0, 1), (2.5, 3)):
        got = Hpa(0, 8).step(0.0, 0, [Metric(MetricSource.OBJECT, TargetType.AVERAGE_VALUE,
                                             1.0, value)])
        assert got == want, value


async def test_the_documented_hpa_validates_and_wakes_from_zero(
        served: tuple[Queue, Path]) -> None:
    """deploy/examples/hpa/vllm-scale-to-zero.yaml (its workload renamed to this test's):
    valid for the HPA schema; at zero pods the planner plans 0 (no pod does any work), and
    the demand metric wakes the workload: the HPA takes the larger."""
    import kubernetes_validate
    import yaml

    queue, kubeconfig = served
    path = Path(__file__).parents[2] / "deploy/examples/hpa/vllm-scale-to-zero.yaml"
    (hpa,) = [d for d in yaml.safe_load_all(path.read_text()) if d]
    kubernetes_validate.validate(hpa, "1.33.0", strict=True)
    spec = hpa["spec"]
    assert spec["minReplicas"] == 0
    api = await connect(kubeconfig)
    queue.pending = True
    try:
        metrics = []
        for m in spec["metrics"]:
            obj = m["object"]
            labels = obj["metric"]["selector"]["matchLabels"]
            selector = "%2C".join(f"{k}%3D{v}" for k, v in labels.items())
            try:
                body = await api.get_raw(
                    f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/llm/deployments.apps/"
                    f"chat/{obj['metric']['name']}?metricLabelSelector={selector}")
                value: float | None = float(parse_quantity(body["items"][0]["value"]))
            except ApiError as exc:
                if exc.status != 503:
                    raise
                value = None
            metrics.append(Metric(MetricSource.OBJECT, TargetType.AVERAGE_VALUE,
                                  float(obj["target"]["averageValue"]), value))
        assert [m.value for m in metrics] == [0.0, 1.0]
        model = Hpa(spec["minReplicas"], spec["maxReplicas"])
        assert model.step(0.0, 0, metrics) == 1
    finally:
        await api.close()


def test_a_value_target_at_zero_replicas_is_its_ratio() -> None:
    """replica_calculator's getUsageRatioReplicaCount at zero: ceil(usage ratio), not x0."""
    for value, want in ((0.0, 0), (0.5, 1), (2.5, 3)):
        got = Hpa(0, 8).step(0.0, 0, [Metric(MetricSource.OBJECT, TargetType.VALUE, 1.0,
                                             value)])
        assert got == want, value
