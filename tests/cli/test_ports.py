"""Ports, seen from outside: a gRPC port gpuscale serves cannot be shared (grpcio binds with
SO_REUSEPORT unless told not to, and the kernel would split KEDA's connections between two
processes), a taken port is one line and exit 1, and every demo listens on loopback only
unless --host says otherwise (the sockets the process really holds, from /proc)."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest

from gpuscale.common.grpc_bind import bind, server_options
from gpuscale.scaler.answers import Answers
from gpuscale.scaler.edges.keda import ScalerServer, ScalerService
from gpuscale.scaler.state.fleet import FleetView
from tests.support.ports import free_port

GPUSCALE = [sys.executable, "-m", "gpuscale.cli"]


async def test_a_served_port_cannot_be_bound_again() -> None:
    """Neither by a server gpuscale makes nor by one with grpcio's defaults (reuse on):
    the kernel allows SO_REUSEPORT only when every socket on the port asked for it."""
    first = grpc.aio.server(options=server_options())
    port = bind(first, "127.0.0.1:0")
    await first.start()
    try:
        for options in (server_options(), None):
            second = grpc.aio.server(options=options)
            with pytest.raises(OSError, match="in use") as err:
                bind(second, f"127.0.0.1:{port}")
            assert str(err.value) == (
                f"127.0.0.1:{port}: the port is in use (another gpuscale, or another "
                f"program, listens there): stop it or choose another port")
            await second.stop(None)
    finally:
        await first.stop(None)


def test_server_options_turn_reuse_off_whatever_was_given() -> None:
    assert server_options([("grpc.so_reuseport", 1), ("grpc.max_concurrent_streams", 8)]) \
        == [("grpc.max_concurrent_streams", 8), ("grpc.so_reuseport", 0)]
    assert ("grpc.so_reuseport", 0) in ScalerServer.options(ScalerService(Answers(FleetView())))


async def test_an_address_this_machine_lacks_says_so() -> None:
    server = grpc.aio.server(options=server_options())
    with pytest.raises(OSError, match=r"^192\.0\.2\.1:0: this machine has no such address"):
        bind(server, "192.0.2.1:0")  # TEST-NET-1: never a local address
    await server.stop(None)


async def test_a_second_scaler_on_a_taken_port_is_one_line_and_exit_1() -> None:
    """The case that mixed two runs' numbers: a scaler already serves the port."""
    held = ScalerServer(ScalerService(Answers(FleetView())), host="127.0.0.1", port=0)
    await held.start()
    try:
        proc = await asyncio.create_subprocess_exec(
            *GPUSCALE, "scaler", "--host", "127.0.0.1", "--port", str(held.port),
            "--metrics-port", "0", "--agents", "127.0.0.1:1", "--agents-insecure",
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        await held.stop(0)
    assert proc.returncode == 1
    assert out == b""
    lines = err.decode().strip().splitlines()
    assert lines[-1] == (f"gpuscale: 127.0.0.1:{held.port}: the port is in use (another "
                         f"gpuscale, or another program, listens there): stop it or "
                         f"choose another port")
    assert "Traceback" not in err.decode()


Listening = set[tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]]


def listening(pid: int) -> Listening:
    """(address, port) of every TCP socket ``pid`` listens on, from /proc/net/tcp{,6}
    (addresses as the kernel writes them: hex, IPv4 in host byte order)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for table in ("tcp", "tcp6"):
        for row in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = row.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # 0A: LISTEN
                address, port = local.split(":")
                found.add((_address(address), int(port, 16)))
    return found


def _address(hexed: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    raw = bytes.fromhex(hexed)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    address = ipaddress.ip_address(words)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


@contextmanager
def demo(*args: str, agents: int = 0) -> Iterator[Listening]:
    """Run ``gpuscale demo ARGS`` (which include --port) until it prints the line naming
    its KEDA port and ``agents`` agents' lines (each printed once its metrics and stream
    ports listen; the loop prints its line once everything listens); what it listens on."""
    port = args[args.index("--port") + 1]
    proc = subprocess.Popen([*GPUSCALE, "demo", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        seen: list[str] = []
        while not any(f":{port}" in line for line in seen) or \
                sum(line.startswith("agent ") for line in seen) < agents:
            line = proc.stdout.readline()
            assert line, f"the demo ended: {''.join(seen)}{proc.stderr.read()}"  # type: ignore[union-attr]
            seen.append(line)
        yield listening(proc.pid)
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


@pytest.mark.parametrize("path", [
    ("--scenario", "h100-vllm", "--metrics-port", "0"),
    ("--pattern", "bursts", "--duration", "600", "--speed", "30"),
    ("--hpa", "--pattern", "bursts", "--duration", "600", "--speed", "30")],
    ids=["scenario", "loop", "loop-hpa"])
def test_every_demo_listens_on_loopback_only(path: tuple[str, ...]) -> None:
    """No --host: KEDA's port (plaintext), the agents' metrics and streams, the gateway,
    the metrics API - every socket the demo listens on is 127.0.0.1's."""
    port = free_port()
    with demo("--port", str(port), *path, agents=1 if path[0] == "--scenario" else 0) as sockets:
        assert (ipaddress.ip_address("127.0.0.1"), port) in sockets
        assert len(sockets) >= 3, sockets  # the scaler's and at least one agent's two
        # 127.0.0.0/8 all: the simulated engines listen on 127.1.0.x, one per pod
        assert all(address.is_loopback for address, _ in sockets), sockets


def test_a_demo_serves_every_interface_when_told() -> None:
    port = free_port()
    with demo("--scenario", "h100-vllm", "--metrics-port", "0", "--host", "0.0.0.0",
              "--port", str(port), agents=1) as sockets:
        # grpcio serves 0.0.0.0 as [::], dual-stack
        assert {(ipaddress.ip_address("::"), port), (ipaddress.ip_address("0.0.0.0"),
                                                     port)} & sockets, sockets
