"""Mutual TLS on the telemetry stream: certificates from files, rotated under a running
agent, and connections without the right client certificate refused."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from gpuscale.agent.app import Agent, AgentConfig
from gpuscale.attribution.sources import ScenarioSources
from gpuscale.scaler.answers import Answers
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.stream.subscriber import AgentSubscriber
from gpuscale.stream.tls import TlsFiles, channel_credentials
from gpuscale.telemetry.scenario import load_scenario
from gpuscale.telemetry.simulated_gpus import SimulatedBackend
from tests.support.pki import Key, issue, make_ca
from tests.support.polling import until


def write(d: Path, name: str, ca: tuple[x509.Certificate, Key],
          leaf: tuple[bytes, bytes]) -> TlsFiles:
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{name}.crt").write_bytes(leaf[0])
    (d / f"{name}.key").write_bytes(leaf[1])
    (d / f"{name}-ca.crt").write_bytes(ca[0].public_bytes(serialization.Encoding.PEM))
    return TlsFiles(d / f"{name}.crt", d / f"{name}.key", d / f"{name}-ca.crt")




Secured = tuple[Agent, TlsFiles, tuple[x509.Certificate, Key]]


@pytest.fixture
async def secured(tmp_path: Path) -> AsyncIterator[Secured]:
    ca = make_ca("gpuscale test CA")
    agent_files = write(tmp_path / "agent", "agent", ca, issue(ca, "agent", "gpuscale-agent"))
    node = load_scenario("timesliced-node").nodes[0]
    agent = Agent(SimulatedBackend(node),
                  AgentConfig("127.0.0.1", 0, 0.2, node.name, 0, agent_files),
                  ScenarioSources(node))
    bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(agent.run(bound.set_result))
    await bound
    yield agent, agent_files, ca
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def subscribe(agent: Agent, creds: Callable[[], object]) -> tuple[AgentSubscriber,
                                                                         FleetView]:
    fleet = FleetView()
    sub = AgentSubscriber(fleet, "test", credentials=creds)  # type: ignore[arg-type]
    sub.set_addresses([f"127.0.0.1:{agent.stream_port}"])
    return sub, fleet


async def test_mutual_tls_stream(secured: Secured,
                                 tmp_path: Path) -> None:
    agent, _, ca = secured
    scaler_files = write(tmp_path / "scaler", "scaler", ca, issue(ca, "scaler", "scaler"))
    sub, fleet = await subscribe(agent, channel_credentials(scaler_files))
    try:
        await until(lambda: fleet.pod_count() == 7)
    finally:
        await sub.close()


@pytest.mark.parametrize("who", ["plaintext", "foreign CA"])
async def test_connections_without_a_trusted_client_certificate_are_refused(
        secured: Secured, tmp_path: Path,
        who: str) -> None:
    agent, _, ca = secured
    if who == "plaintext":
        creds: Callable[[], object] = lambda: None  # noqa: E731
    else:
        rogue = make_ca("rogue")
        files = write(tmp_path / "rogue", "rogue", rogue, issue(rogue, "x", "x"))
        # Trusts the agent's CA (so the failure is the agent refusing the client).
        files.ca.write_bytes(ca[0].public_bytes(serialization.Encoding.PEM))
        creds = channel_credentials(files)
    sub, fleet = await subscribe(agent, creds)
    try:
        link = next(iter(sub.links.values()))[0]
        await until(lambda: link.state.reconnects >= 2)
        assert fleet.pod_count() == 0
        assert link.state.error
    finally:
        await sub.close()


async def test_rotated_certificates_are_picked_up(
        secured: Secured, tmp_path: Path) -> None:
    agent, agent_files, _ = secured
    # Rotate to a new CA: new agent certificate and new trusted client CA, same files.
    new_ca = make_ca("gpuscale test CA 2")
    write(tmp_path / "agent", "agent", new_ca, issue(new_ca, "agent", "gpuscale-agent"))
    scaler_files = write(tmp_path / "scaler2", "scaler", new_ca,
                         issue(new_ca, "scaler", "scaler"))
    sub, fleet = await subscribe(agent, channel_credentials(scaler_files))
    try:
        await until(lambda: fleet.pod_count() == 7)  # only possible with the reloaded files
    finally:
        await sub.close()
    assert agent_files.cert.read_bytes().startswith(b"-----BEGIN CERTIFICATE-----")


@pytest.mark.parametrize("answer_process", [False, True],
                         ids=["in-process", "answer-process"])
async def test_keda_side_of_the_scaler_over_mutual_tls(tmp_path: Path,
                                                       answer_process: bool) -> None:
    """What a TriggerAuthentication with caCert, tlsClientCert and tlsClientKey does, to
    the scaler's own port and to its gRPC front (--answer-process)."""
    import grpc

    from gpuscale.proto import externalscaler_pb2 as pb
    from gpuscale.proto import externalscaler_pb2_grpc as pb_grpc
    from gpuscale.scaler.edges.keda import ScalerServer, ScalerService
    from gpuscale.scaler.edges.keda import add_to_server as add_keda
    from gpuscale.scaler.edges.relay_backend import RelayBackend
    from gpuscale.scaler.edges.relay_supervisor import Front
    from gpuscale.stream.tls import server_credentials

    ca = make_ca("keda-gpuscale CA")
    server_files = write(tmp_path / "s", "scaler", ca, issue(ca, "scaler", "gpuscale-scaler"))
    keda_files = write(tmp_path / "k", "keda", ca, issue(ca, "keda", "keda"))
    service = ScalerService(Answers(FleetView()))
    front = Front(RelayBackend([lambda s: add_keda(service, s)]))
    server = ScalerServer(service, host="127.0.0.1", port=0,
                          credentials=server_credentials(server_files))
    if answer_process:
        port = await front.start("127.0.0.1:0", server_files, ScalerServer.options(service))
    else:
        await server.start()
        port = server.port
    ref = pb.ScaledObjectRef(name="so", namespace="ns", scalerMetadata={"podSelector": "a=b"})
    try:
        opts = [("grpc.ssl_target_name_override", "gpuscale-scaler")]
        async with grpc.aio.secure_channel(f"127.0.0.1:{port}",
                                           channel_credentials(keda_files)(), opts) as ch:
            assert (await pb_grpc.ExternalScalerStub(ch).IsActive(ref)).result is False
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            with pytest.raises(grpc.aio.AioRpcError):
                await pb_grpc.ExternalScalerStub(ch).IsActive(ref, timeout=3)
    finally:
        await front.stop(service.stopping)
        await server.stop(0.2)
