"""The scaler's KEDA port around a service the test holds, as the scaler serves it: by its
own gRPC server (in process), or by its gRPC front (scaler.edges.relay, --answer-process),
where the test process is the fleet process and the front a real child process."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from gpuscale.scaler.edges.keda import ScalerServer, ScalerService
from gpuscale.scaler.edges.keda import add_to_server as add_keda
from gpuscale.scaler.edges.relay_backend import RelayBackend
from gpuscale.scaler.edges.relay_supervisor import Front

MODES = ("in-process", "answer-process")


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


@asynccontextmanager
async def keda_port(service: ScalerService, mode: str,
                    ) -> AsyncIterator[tuple[int, Callable[[], Awaitable[None]]]]:
    """(the port on 127.0.0.1, how the scaler stops it: streams end cleanly) for ``mode``
    in MODES; stopped on the way out if the test did not."""
    if mode == "answer-process":
        async with relayed(service) as front:
            yield front.port, lambda: front.stop(service.stopping)
        return
    server = ScalerServer(service, host="127.0.0.1", port=0)
    await server.start()
    try:
        yield server.port, lambda: server.stop(2.0)
    finally:
        await server.stop(0.5)
