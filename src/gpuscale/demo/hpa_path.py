"""The closed loop through the plain-HPA path: the scaler serves the custom metrics API in
local mode (metrics_api.local: loopback only, its own certificate, a printed token, no
Kubernetes API server), and a model of the HPA controller reads it over HTTPS with a
Kubernetes client from the kubeconfig the run writes - the request the
kube-controller-manager makes through the aggregation layer - every sync period, and
sets the replicas. ``kubectl --kubeconfig ... get --raw`` reads the same answers.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from gpuscale.common.errors import Unavailable
from gpuscale.demo.view import Decision, Status
from gpuscale.demo.world import NAMESPACE, WORKLOAD, LiveConfig, SimClock, World
from gpuscale.kube.errors import ApiError, BadReply
from gpuscale.metrics_api.local import LocalAccess
from gpuscale.metrics_api.main import MetricsApi, MetricsApiOptions
from gpuscale.metrics_api.quantity import parse_quantity
from gpuscale.metrics_api.served_metrics import DEMAND_METRIC, object_metric_name
from gpuscale.models.hpa import SCALE_DOWN, SCALE_UP, Hpa, Metric, MetricSource, TargetType
from gpuscale.models.keda import HPA_SYNC_S
from gpuscale.models.planner_behavior import planner_rules
from gpuscale.scaler.core.profiles import PLANNED
from gpuscale.scaler.core.selector import Selector, parse_selector
from gpuscale.scaler.core.trigger import PLANNER_KEYS, parse_metadata

GROUP_PATH = "/apis/custom.metrics.k8s.io/v1beta2"


class DemoTargets:
    """The demo Deployment's selector (what the workload resolver reads in a cluster)."""

    def target(self, namespace: str, kind: str, name: str) -> Selector | Unavailable | None:
        if (namespace, kind, name) == (NAMESPACE, "Deployment", WORKLOAD):
            return parse_selector(f"app={WORKLOAD}")
        return None


@dataclass(frozen=True, slots=True)
class ObjectMetric:
    """One metric of the HPA's spec: an Object metric of the demo Deployment."""

    name: str  # gpuscale_<signal>
    target: float  # AverageValue
    selector: str  # metricLabelSelector ("" for none)

    def path(self) -> str:
        query = f"?metricLabelSelector={quote(self.selector)}" if self.selector else ""
        return (f"{GROUP_PATH}/namespaces/{NAMESPACE}/deployments.apps/{WORKLOAD}/"
                f"{self.name}{query}")


def hpa_metrics(metadata: dict[str, str]) -> list[ObjectMetric]:
    """The HPA spec's metrics for a trigger's metadata, as ``gpuscale generate --hpa``
    writes them: each target an Object metric; the planner's settings as its selector;
    with a demand source (and minReplicas 0), ``gpuscale_demand_pending`` beside them
    (docs/hpa.md: scale to zero without KEDA)."""
    trigger = parse_metadata(metadata)
    settings = ",".join(f"{k}={v}" for k, v in metadata.items() if k in PLANNER_KEYS)
    out = [ObjectMetric(object_metric_name(t.signal), t.target,
                        settings if t.signal == PLANNED else "")
           for t in trigger.targets]
    if trigger.demand_source:  # wakes the workload at zero pods (HPAScaleToZero)
        out.append(ObjectMetric(DEMAND_METRIC, 1.0,
                                f"demandSource={trigger.demand_source}"))
    return out


@dataclass
class LocalApi:
    """The local metrics API the run serves: its credentials, and once it listens, its
    port and the kubeconfig written for it."""

    access: LocalAccess
    port: int = 0
    kubeconfig: Path | None = None

    def component(self, cfg: LiveConfig, up: Callable[[int], None]) -> MetricsApi:
        def listening(port: int) -> None:
            self.port = port
            self.kubeconfig = self.access.write_kubeconfig(port)
            up(port)
        return MetricsApi(MetricsApiOptions(
            "127.0.0.1", cfg.metrics_api_port, self.access.cert, self.access.key,
            local=self.access, targets=DemoTargets()), listening)

    def remove(self) -> None:
        """Delete the run's credentials (its key, certificates, token, kubeconfig)."""
        shutil.rmtree(self.access.dir, ignore_errors=True)

    def kubectl_hint(self, metric: ObjectMetric) -> str:
        return f"kubectl --kubeconfig {self.kubeconfig} get --raw '{metric.path()}'"


def local_api() -> LocalApi:
    """Credentials for this run in a new private directory."""
    return LocalApi(LocalAccess.create(Path(tempfile.mkdtemp(prefix="gpuscale-local-"))))


async def control_hpa(world: World, clock: SimClock, status: Status, local: LocalApi,
                      metadata: dict[str, str],
                      on_decision: Callable[[Decision], None]) -> None:
    """The HPA controller: every sync period, each Object metric read through a
    Kubernetes client (the run's kubeconfig) over HTTPS, then autoscaling/v2's
    arithmetic. A metric that cannot be read (503 with the scaler's reason) is None: the
    HPA does not scale down on it. The planner's HPA has the planner's behavior
    (``models.planner_behavior``: it holds its own plan, and its count is exact)."""
    from gpuscale.kube.connect import connect

    cfg = world.cfg
    metrics = hpa_metrics(metadata)
    planner = any(m.name == object_metric_name(PLANNED) for m in metrics)
    up, down = planner_rules() if planner else (SCALE_UP, SCALE_DOWN)
    hpa = Hpa(cfg.min_replicas, cfg.max_replicas,  # 0: Kubernetes 1.37's HPAScaleToZero
              scale_up=up, scale_down=down)
    hpa.remember(clock.now(), len(world.pods))  # the demo opens on a running Deployment
    assert local.kubeconfig is not None
    api = await connect(local.kubeconfig)
    last = -HPA_SYNC_S
    try:
        while not world.done:
            now = clock.now()
            if now - last >= HPA_SYNC_S:
                last = now
                readings, status.metrics, status.error = [], [], ""
                began = time.monotonic()
                for m in metrics:
                    value: float | None = None
                    try:
                        body = await api.get_raw(m.path())
                        value = float(parse_quantity(str(body["items"][0]["value"])))
                    except (ApiError, BadReply, KeyError, IndexError, TypeError,
                            ValueError) as exc:
                        status.error = f"GET {m.name}: {str(exc)[:160]}"
                    readings.append(Metric(MetricSource.OBJECT, TargetType.AVERAGE_VALUE,
                                           m.target, value))
                    status.metrics.append((m.name, m.target, value))
                status.rpc_ms = (time.monotonic() - began) * 1000.0
                replicas = len(world.pods)
                desired = hpa.step(now, replicas, readings, world.ready_count())
                if desired != replicas:
                    world.scale(desired)
                    decision = Decision(now, replicas, desired, f"HPA: {hpa.last_reason}",
                                        time.time())
                    status.decisions.append(decision)
                    on_decision(decision)
            await asyncio.sleep(0.02)
    finally:
        await api.close()
