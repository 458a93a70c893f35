"""The scaler's configuration, typed and built once (by the command line, a demo or a test)
before anything starts; ``scaler.root.Scaler`` is built from it."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from gpuscale.common.errors import ConfigError
from gpuscale.common.freshness import staleness_bound
from gpuscale.scaler import DEFAULT_PORT
from gpuscale.scaler.advisory import AdvisoryWorkload, parse_advisory
from gpuscale.scaler.sources.demand import DemandConfig, parse_config
from gpuscale.scaler.state.history import STEP_S
from gpuscale.scaler.state.streams import MEMORY_BUDGET_MIB
from gpuscale.stream.tls import TlsFiles

DEFAULT_METRICS_PORT = 9402
DEFAULT_AGENT_PORT = 9401


@dataclass(frozen=True, slots=True)
class ScalerConfig:
    host: str = "0.0.0.0"
    port: int = DEFAULT_PORT  # KEDA's gRPC port (ExternalScaler, Inspect, health)
    metrics_port: int | None = DEFAULT_METRICS_PORT  # /metrics, /healthz, /readyz; None: off
    tls: TlsFiles | None = None  # KEDA-facing mutual TLS; None: plaintext
    # Where the fleet view comes from: static agent addresses, or the EndpointSlices of the
    # agents' headless Service ("NAMESPACE/NAME"), or (in_process) the caller's own agents
    # writing into the fleet view (a demo, a test: complete by construction, no roster).
    agents: tuple[str, ...] = ()
    agent_service: str = ""
    agent_port: int = DEFAULT_AGENT_PORT  # when an EndpointSlice names none
    in_process: bool = False
    agent_tls: TlsFiles | None = None  # mutual TLS to the agents; None: plaintext
    agent_tls_server_name: str = "gpuscale-agent"
    name: str = field(default_factory=socket.gethostname)  # how agents see this subscriber
    # The Kubernetes API: resolve ScaledObjects' scaleTargetRef (and the metrics API's
    # Deployments and StatefulSets) through watches.
    resolve_targets: bool = False
    kubeconfig: Path | None = None  # None: in-cluster credentials
    demand: DemandConfig = field(default_factory=DemandConfig)
    advisory: tuple[AdvisoryWorkload, ...] = ()  # planned beside what scales them today
    history_step_s: float = STEP_S  # between the moments recorded for gpuscale explain
    stale_after_s: float = staleness_bound(1.0)  # for records whose agent names no bound
    stream_memory_mib: int = MEMORY_BUDGET_MIB  # KEDA's open streams (scaler.state.streams)
    time_scale: float = 1.0  # planner seconds per second (the fast-forwarded demo)
    # KEDA's gRPC port in a child process that relays each call here (scaler.edges.relay)
    answer_process: bool = False

    @property
    def uses_api(self) -> bool:
        """Whether the scaler needs Kubernetes credentials."""
        return bool(self.agent_service) or self.resolve_targets

    def agents_text(self) -> str:
        return self.agent_service or ", ".join(self.agents) or "in process"


def load_file(path: Path) -> tuple[DemandConfig, tuple[AdvisoryWorkload, ...]]:
    """The scaler's YAML configuration (``--config``): its demand sources
    (``scaler.sources.demand``) and advisory workloads (``scaler.advisory``). ConfigError
    naming the file and what is wrong."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from exc
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    data = data or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: configuration: expected a mapping")
    rest = {k: v for k, v in data.items() if k != "advisory"}
    try:
        return parse_config(rest), parse_advisory(data.get("advisory"))
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
