"""The metrics API as a part of the scaler process: built from the scaler's parts.

Why in the scaler and not a process of its own: the answers come from the fleet view, which
the scaler already holds from every agent's stream. A separate server would subscribe to
every agent again (twice the fan-in) or add a hop and its staleness. It runs on its own
port with its own certificate, and only when ``--metrics-api-port`` is given.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuscale.common.errors import ConfigError
from gpuscale.metrics_api.answers import MetricAnswers
from gpuscale.metrics_api.authz import Authorizer
from gpuscale.metrics_api.server import AUTH_CONFIGMAP, MetricsApiServer, TrustSource
from gpuscale.scaler.main import Extra, Parts


@dataclass(frozen=True, slots=True)
class MetricsApiOptions:
    host: str
    port: int
    cert: Path
    key: Path


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


def metrics_api(options: MetricsApiOptions,
                on_listening: Callable[[int], None] | None = None) -> Extra:
    async def run(parts: Parts) -> None:
        if parts.api is None:
            raise ConfigError("the metrics API needs the Kubernetes API (in-cluster "
                              "credentials or --kubeconfig)")
        answers = MetricAnswers(parts.fleet, parts.roster, parts.workloads, parts.plans)
        server = MetricsApiServer(answers, Authorizer(parts.api),
                                  TrustSource(configmap_reader(parts.api)),
                                  options.cert, options.key, options.host, options.port)
        await server.serve(on_listening)

    return run
