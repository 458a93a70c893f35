"""The metrics API as a part of the scaler process: a component of its ``Scaler``.

Why in the scaler and not a process of its own: the answers come from the fleet view, which
the scaler already holds from every agent's stream. A separate server would subscribe to
every agent again (twice the fan-in) or add a hop and its staleness. It runs on its own
port with its own certificate, and only when ``--metrics-api-port`` is given.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import ssl
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuscale.common.errors import ConfigError
from gpuscale.metrics_api.answers import MetricAnswers, Targets
from gpuscale.metrics_api.authz import Authorizer
from gpuscale.metrics_api.local import LocalAccess
from gpuscale.metrics_api.server import AUTH_CONFIGMAP, MetricsApiServer, TrustSource
from gpuscale.scaler.root import Scaler

log = logging.getLogger(__name__)
RETRY_S = (5.0, 10.0, 30.0, 60.0)  # after a certificate or port problem


@dataclass(frozen=True, slots=True)
class MetricsApiOptions:
    host: str
    port: int
    cert: Path
    key: Path
    local: LocalAccess | None = None  # local mode: no Kubernetes API (metrics_api.local)
    targets: Targets | None = None  # the workloads' selectors without the API (local mode)


def configmap_reader(api: Any) -> Callable[[], Any]:
    """Reads the ``data`` of kube-system/extension-apiserver-authentication."""
    from gpuscale.kube.api import ObjectRef

    async def read() -> dict[str, str]:
        body = await api.get(ObjectRef("v1", "configmaps", *AUTH_CONFIGMAP))
        data = body.get("data")
        if not isinstance(data, dict):
            raise ConfigError("the ConfigMap has no data")
        return {str(k): str(v) for k, v in data.items()}

    return read


class MetricsApiCollector(Collector):
    """Answers by HTTP status, and the SubjectAccessReviews sent, on the scaler's /metrics."""

    def __init__(self, server: MetricsApiServer) -> None:
        self._server = server

    def collect(self) -> Iterable[Metric]:
        answers = CounterMetricFamily("gpuscale_metrics_api_requests",
                                      "custom.metrics.k8s.io requests answered, by HTTP "
                                      "status (503: missing or stale data)", labels=["code"])
        for code, n in sorted(self._server.served.items()):
            answers.add_metric([str(code)], n)
        yield answers
        yield CounterMetricFamily("gpuscale_metrics_api_reviews",
                                  "SubjectAccessReviews sent (decisions are cached 10 s)",
                                  value=self._server.authorizer.reviews
                                  if self._server.authorizer is not None else 0)


class MetricsApi:
    """The metrics API as a component of the scaler (``scaler.root.Component``)."""

    def __init__(self, options: MetricsApiOptions,
                 on_listening: Callable[[int], None] | None = None) -> None:
        self.options = options
        self.on_listening = on_listening

    async def run(self, scaler: Scaler) -> None:
        options = self.options
        if options.local is not None:
            server = MetricsApiServer(
                MetricAnswers(scaler.answers, options.targets or scaler.resolver,
                              history=scaler.service.history), None, None,
                options.local.cert, options.local.key, options.host, options.port,
                local=options.local)
        elif scaler.api is None:
            raise ConfigError("the metrics API needs the Kubernetes API (in-cluster "
                              "credentials or --kubeconfig)")
        else:
            server = MetricsApiServer(MetricAnswers(scaler.answers, scaler.resolver,
                                                    history=scaler.service.history),
                                      Authorizer(scaler.api),
                                      TrustSource(configmap_reader(scaler.api)),
                                      options.cert, options.key, options.host, options.port)
        scaler.registry.register(MetricsApiCollector(server))
        if options.local is not None:  # a local run: its port taken is its end, said once
            await server.serve(self.on_listening)
            return
        for delay in itertools.chain(RETRY_S, itertools.repeat(RETRY_S[-1])):
            try:
                await server.serve(self.on_listening)
            except (OSError, ssl.SSLError, ConfigError) as exc:  # a certificate, a port:
                log.error("metrics API not serving (retry in %.0fs): %s", delay, exc)
            await asyncio.sleep(delay)  # ... the KEDA service beside it goes on
