"""The scaler's gRPC front (scaler.edges.relay) around a service the test holds: the test
process is the fleet process, the front a real child process on a loopback port."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from gpuscale.scaler.edges.keda import ScalerServer, ScalerService
from gpuscale.scaler.edges.keda import add_to_server as add_keda
from gpuscale.scaler.edges.relay import Front, RelayBackend


@asynccontextmanager
async def relayed(service: ScalerService,
                  *extra: Callable[[Any], None]) -> AsyncIterator[Front]:
    """``service`` (and ``extra`` registrations, e.g. Inspect) behind a front on
    127.0.0.1 (``front.port``); stopped as the scaler stops it."""
    front = Front(RelayBackend([lambda s: add_keda(service, s), *extra]))
    await front.start("127.0.0.1:0", None, ScalerServer.options(service))
    try:
        yield front
    finally:
        await front.stop(service.stopping)
