"""Fixtures shared by the whole suite; the helpers tests import by name are in
``tests/support/`` (see its package doc).

Folders mirror ``src/gpuscale/`` (one per layer); ``e2e/`` runs several processes or real
external servers; ``peers/`` holds the fakes of real protocol peers (see its README).
Tests synchronise by polling for the state they expect (``tests.support.polling.until``),
never by sleeping a guessed time.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from gpuscale.scaler.state.fleet import FleetView
from tests.peers.kubeapi import KubeApiPeer
from tests.peers.kubelet import KubeletPeer
from tests.support.clock import Clock
from tests.support.ports import free_port
from tests.support.processes import Served, start_scenario_scaler

# No test asserts a timing: hypothesis's per-example deadline (200 ms) and its "too slow"
# health check fail a test on a busy machine, not on a wrong answer.
settings.register_profile("gpuscale", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("gpuscale")


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def fleet(clock: Clock) -> FleetView:
    """A fleet view on the hand-moved clock, with a 3 s staleness bound."""
    return FleetView(stale_after=3.0, monotonic=clock)


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


@pytest.fixture(scope="module")
def scenario_scaler() -> Iterator[Served]:
    """A real scaler process serving the ``mig-node`` scenario (two H100s and an A100 split
    into MIG instances, six pods, Triton and TGI engines; the A100's instances report no
    utilization), shared by a test module. Its simulated engines listen on ports they
    chose free, so it runs beside any other demo or test run."""
    proc = start_scenario_scaler(port := free_port())
    try:
        yield Served(f"127.0.0.1:{port}", proc)
    finally:
        proc.stop()
