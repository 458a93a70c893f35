"""Helpers and fixtures shared by the whole suite.

Folders mirror ``src/gpuscale/`` (one per layer); ``e2e/`` runs several processes or real
external servers; ``peers/`` holds the fakes of real protocol peers (see its README).
Tests synchronise by polling for the state they expect (``until``), never by sleeping a
guessed time.
"""

from __future__ import annotations

import asyncio
import datetime
import inspect
import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from hypothesis import strategies as st

from gpuscale.agent.app import Agent, AgentConfig
from gpuscale.attribution.sources import ScenarioSources
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.telemetry.scenario import NodeSpec, load_scenario
from gpuscale.telemetry.simulated_gpus import SimulatedBackend
from tests.peers.kubeapi import KubeApiPeer
from tests.peers.kubelet import KubeletPeer


async def until(cond: Callable[[], Any], within: float = 10.0, what: str = "condition",
                every: float = 0.02, tolerate: tuple[type[BaseException], ...] = ()) -> Any:
    """Poll ``cond`` until it returns something truthy and return that; AssertionError
    naming ``what`` and the last value when ``within`` seconds pass first. ``cond`` may
    return an awaitable (an RPC, an attribution tick): its result is what counts.
    Exceptions of the ``tolerate`` types count as "not yet" (a server still starting)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    last: Any = None
    while True:
        try:
            last = cond()
            if inspect.isawaitable(last):
                last = await last
        except tolerate as exc:
            last = exc
        else:
            if last:
                return last
        if loop.time() > deadline:
            raise AssertionError(f"{what} not met in {within:g}s; last {last!r}")
        await asyncio.sleep(every)


def until_sync(cond: Callable[[], Any], within: float = 15.0, what: str = "condition",
               every: float = 0.1, tolerate: tuple[type[BaseException], ...] = ()) -> Any:
    """``until`` for synchronous tests (processes driven from the test thread), with the
    same semantics and message; ``cond`` is a plain callable here."""
    deadline = time.monotonic() + within
    last: Any = None
    while True:
        try:
            last = cond()
        except tolerate as exc:
            last = exc
        else:
            if last:
                return last
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met in {within:g}s; last {last!r}")
        time.sleep(every)


@asynccontextmanager
async def running_agents(nodes: list[NodeSpec], interval: float = 0.2,
                         stream_ports: list[int] | None = None,
                         hostnames: list[str] | None = None) -> AsyncIterator[list[Agent]]:
    """In-process agents over simulated GPUs and their scenario's pods, each serving its
    telemetry stream on loopback (port 0 unless ``stream_ports`` says), stopped on exit."""
    agents, tasks = [], []
    for i, node in enumerate(nodes):
        port = stream_ports[i] if stream_ports else 0
        name = hostnames[i] if hostnames else node.name
        agent = Agent(SimulatedBackend(node), AgentConfig("127.0.0.1", 0, interval, name,
                                                          port), ScenarioSources(node))
        bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        tasks.append(asyncio.create_task(agent.run(bound.set_result)))
        await bound
        agents.append(agent)
    try:
        yield agents
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def json_values(keys: Sequence[str], max_leaves: int = 30) -> st.SearchStrategy[Any]:
    """Any JSON value, its objects keyed by ``keys`` (the field names a reader looks up)
    and a few others, so hostile shapes land where the reader looks."""
    scalars = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
               | st.text(max_size=8))
    names = st.sampled_from([*keys, "x"])
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                        | st.dictionaries(names, inner, max_size=6), max_leaves=max_leaves)


class Clock:
    """A monotonic clock a test moves by hand (``clock.now += 10``: the agents went quiet)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def fleet(clock: Clock) -> FleetView:
    """A fleet view on the hand-moved clock, with a 3 s staleness bound."""
    return FleetView(stale_after=3.0, monotonic=clock)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def kubeapi() -> AsyncIterator[KubeApiPeer]:
    """The API-server peer (tests/peers/kubeapi.py), started on a free port."""
    peer = KubeApiPeer()
    await peer.start()
    yield peer
    await peer.stop()


@pytest.fixture
async def kubelet(tmp_path: Path) -> AsyncIterator[KubeletPeer]:
    """The kubelet peer (tests/peers/kubelet.py), serving on a fresh unix socket."""
    # Unix socket paths are limited to ~107 bytes; pytest's tmp_path can be longer.
    peer = KubeletPeer(Path(f"/tmp/gs-kl-{os.getpid()}-{id(tmp_path)}.sock"))
    await peer.start()
    yield peer
    await peer.stop()


# -- processes ------------------------------------------------------------------------------


class Proc:
    """``gpuscale ARGS`` in a child process, up once one of its first lines of output
    holds ``ready`` (what the command prints when it listens)."""

    def __init__(self, *args: str, ready: str = "gpuscale") -> None:
        self.args = args
        self.ready = ready
        self.p = self._start()

    def _start(self) -> subprocess.Popen[str]:
        p = subprocess.Popen([sys.executable, "-m", "gpuscale.cli", *self.args],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert p.stdout is not None
        lines = [p.stdout.readline()]
        while self.ready not in lines[-1] and lines[-1] and len(lines) < 20:
            lines.append(p.stdout.readline())
        assert self.ready in lines[-1], lines
        return p

    def restart(self) -> None:
        self.stop()
        self.start()

    def start(self) -> None:
        """Start it again after ``stop``, returning once it has said it is up."""
        self.p = self._start()

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGCONT)
            self.p.terminate()
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


def inspect_fleet(address: str) -> Any:
    """The Fleet reply of the scaler at ``address`` (ToolError when it does not answer)."""
    from gpuscale.tools.client import InspectClient, Target

    with InspectClient(Target(address), timeout_s=5.0) as client:
        return client.fleet()


def start_scenario_scaler(port: int, scenario: str = "mig-node") -> Proc:
    """``gpuscale demo --scenario`` serving its scaler on 127.0.0.1:``port``, returned
    once the scaler's fleet view holds the scenario's pods."""
    from gpuscale.tools.client import ToolError

    proc = Proc("demo", "--scenario", scenario, "--host", "127.0.0.1", "--port", str(port),
                "--metrics-port", "0", "--interval", "0.5", ready="KEDA external scaler on")
    try:
        until_sync(lambda: inspect_fleet(f"127.0.0.1:{port}").pods, 15.0,
                   f"the {scenario} pods at the scaler", tolerate=(ToolError,))
    except BaseException:
        proc.stop()
        raise
    return proc


@dataclass(frozen=True)
class Served:
    address: str  # host:port
    proc: Proc    # stop() and start() it again on the same port


@pytest.fixture(scope="module")
def scenario_scaler() -> Iterator[Served]:
    """A real scaler process serving the ``mig-node`` scenario (two H100s and an A100 split
    into MIG instances, six pods, Triton and TGI engines; the A100's instances report no
    utilization), shared by a test module. One at a time per machine: its simulated engines
    listen on fixed loopback addresses (127.1.0.x:18080)."""
    proc = start_scenario_scaler(port := free_port())
    try:
        yield Served(f"127.0.0.1:{port}", proc)
    finally:
        proc.stop()


class HistoryDemo:
    """``gpuscale demo --scenario`` on a free port whose scaler records its history every
    ``history_step`` seconds (not 15: ``gpuscale idle`` tests see minutes fill at once);
    ``metrics`` are its agents' /metrics URLs by node. Stop it with ``stop()``."""

    def __init__(self, scenario: str, history_step: float = 0.5, interval: float = 0.5) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.p = subprocess.Popen(
            [sys.executable, "-m", "gpuscale.cli", "demo", "--scenario", scenario, "--host",
             "127.0.0.1", "--port", str(self.port), "--metrics-port", "0", "--interval",
             str(interval), "--history-step", str(history_step)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert self.p.stdout is not None
        self.metrics: dict[str, str] = {}
        nodes = len(load_scenario(scenario).nodes)
        up = False
        while not up or len(self.metrics) < nodes:
            line = self.p.stdout.readline()
            if not line:
                self.stop()
                raise AssertionError(f"the demo ended before it was up: {self.p.returncode}")
            up = up or line.startswith("KEDA external scaler on")
            if line.startswith("agent ") and "metrics at " in line:
                node = line.split()[1].rstrip(":")
                self.metrics[node] = line.split("metrics at ")[1].strip()

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


# -- certificates (mutual TLS, the metrics API's front proxy) ----------------------------

HPA_USER = "system:serviceaccount:kube-system:horizontal-pod-autoscaler"

Key = ec.EllipticCurvePrivateKey


def _name(cn: str, orgs: Sequence[str] = ()) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn),
                      *(x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs)])


def make_ca(cn: str, days: float = 1.0) -> tuple[x509.Certificate, Key]:
    """A self-signed CA (EC P-256) valid from an hour ago for ``days``."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(_name(cn))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return cert, key


def issue(ca: tuple[x509.Certificate, Key], cn: str, dns: str = "", *,
          orgs: Sequence[str] = (), client: bool = False,
          valid_days: float = 1.0) -> tuple[bytes, bytes]:
    """A leaf certificate and its key (PEM) signed by ``ca``: a server certificate for
    ``dns`` and 127.0.0.1, or (``client``) a client certificate whose subject carries
    ``orgs`` (Kubernetes reads them as groups). ``valid_days`` < 0: already expired."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    start, end = ((now - datetime.timedelta(days=2), now - datetime.timedelta(days=1))
                  if valid_days < 0 else (now - datetime.timedelta(hours=1),
                                          now + datetime.timedelta(days=valid_days)))
    builder = (x509.CertificateBuilder().subject_name(_name(cn, orgs))
               .issuer_name(ca[0].subject).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(start).not_valid_after(end))
    if client:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    else:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName(dns or cn), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False)
    cert = builder.sign(ca[1], hashes.SHA256())
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM,
                              serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


def pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def write_kubeconfig(path: Path, server: str, user: dict[str, Any] | None,
                     ca: Path | None = None) -> Path:
    """A kubeconfig (JSON is YAML) for one cluster and user: ``user`` as kubeconfig spells
    it (``{"token": ...}``, ``{"client-certificate": ..., "client-key": ...}``, an exec
    plugin...; None: a context without a user), ``ca`` the server's CA file for https."""
    cluster: dict[str, str] = {"server": server}
    if ca is not None:
        cluster["certificate-authority"] = str(ca)
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user}] if user else [],
        "contexts": [{"name": "c", "context": {"cluster": "c",
                                               **({"user": "u"} if user else {})}}]}))
    return path


# -- manifests: Kubernetes schemas of a pinned version, and the shared CRDs --------------

SCHEMAS = Path(__file__).resolve().parents[2] / "shared" / "schemas"  # ../shared
K8S_VERSION = "1.33.0"  # the oldest Kubernetes release the manifests promise to support
CRDS = {
    ("keda.sh/v1alpha1", "ScaledObject"): "keda.sh_scaledobjects.yaml",
    ("keda.sh/v1alpha1", "TriggerAuthentication"): "keda.sh_triggerauthentications.yaml",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "monitoring.coreos.com_servicemonitors.yaml",
    ("monitoring.coreos.com/v1", "PodMonitor"): "monitoring.coreos.com_podmonitors.yaml",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "monitoring.coreos.com_prometheusrules.yaml",
}
# Kinds whose schemas /work/shared/schemas does not hold: the KEDA HTTP add-on's, and
# cert-manager's (overlays/metrics-api); test_metrics_api checks the fields these objects
# are there for (issuer chain, Secret, DNS names) instead.
NOT_OURS = {("http.keda.sh/v1alpha1", "HTTPScaledObject"),
            ("cert-manager.io/v1", "Issuer"), ("cert-manager.io/v1", "Certificate")}


def _python_patterns(node: Any) -> Any:
    """CRD schemas carry Go regexes; Python wants inline flags first (``^(?i)x`` ->
    ``(?i)^x``), the only difference these schemas hit."""
    if isinstance(node, dict):
        out = {k: _python_patterns(v) for k, v in node.items()}
        if isinstance(out.get("pattern"), str) and out["pattern"].startswith("^(?i)"):
            out["pattern"] = "(?i)^" + out["pattern"][len("^(?i)"):]
        return out
    if isinstance(node, list):
        return [_python_patterns(v) for v in node]
    return node


@cache
def crd_schema(api_version: str, kind: str) -> dict[str, Any]:
    crd = yaml.safe_load((SCHEMAS / CRDS[(api_version, kind)]).read_text())
    version = api_version.split("/")[1]
    schema = next(v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"]
                  if v["name"] == version)
    return dict(_python_patterns(schema))


def validate(obj: dict[str, Any]) -> None:
    key = (obj["apiVersion"], obj["kind"])
    if key in CRDS:
        jsonschema.validate(obj, crd_schema(*key))
    elif key not in NOT_OURS:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
