"""Demand sources: operator-declared pending work that wakes a workload from zero."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import grpc
import pytest
from aiohttp import web

from gpuscale.common.errors import ConfigError
from gpuscale.proto import externalscaler_pb2 as pb
from gpuscale.proto import externalscaler_pb2_grpc as pb_grpc
from gpuscale.scaler.demand import DemandSources, parse_config
from gpuscale.scaler.fleet import FleetView
from gpuscale.scaler.service import ScalerServer, ScalerService


class Gateway:
    """A real HTTP server: a gateway's /metrics and a Prometheus-style query API."""

    def __init__(self) -> None:
        self.pending = 0.0
        self.prom_value: str | None = "0"
        self.status = 200

    async def metrics(self, _: web.Request) -> web.Response:
        text = ("# TYPE gateway_pending_requests gauge\n"
                f'gateway_pending_requests{{model="llama"}} {self.pending}\n'
                'gateway_pending_requests{model="other"} 50\n')
        return web.Response(text=text, status=self.status)

    async def query(self, request: web.Request) -> web.Response:
        assert request.query["query"] == "sum(queue_depth)"
        result: list[dict[str, Any]] = ([] if self.prom_value is None else
                                        [{"metric": {}, "value": [0, self.prom_value]}])
        return web.json_response({"status": "success",
                                  "data": {"resultType": "vector", "result": result}})


@pytest.fixture
async def gateway() -> AsyncIterator[tuple[Gateway, int]]:
    gw = Gateway()
    app = web.Application()
    app.router.add_get("/metrics", gw.metrics)
    app.router.add_get("/api/v1/query", gw.query)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield gw, int(runner.addresses[0][1])
    await runner.cleanup()


def config(port: int) -> dict[str, Any]:
    return {"interval_s": 0.1, "timeout_s": 1, "demandSources": [
        {"name": "gateway", "kind": "metrics", "url": f"http://127.0.0.1:{port}/metrics",
         "metric": "gateway_pending_requests", "labels": {"model": "llama"}},
        {"name": "queue", "kind": "prometheus", "url": f"http://127.0.0.1:{port}",
         "query": "sum(queue_depth)"}]}


async def test_scale_from_zero_with_pending_work(gateway: tuple[Gateway, int]) -> None:
    gw, port = gateway
    sources = DemandSources(parse_config(config(port)))
    task = asyncio.create_task(sources.run())
    server = ScalerServer(ScalerService(FleetView(), demand=sources.pending),
                          host="127.0.0.1", port=0)
    await server.start()
    ref = pb.ScaledObjectRef(name="so", namespace="llm", scalerMetadata={
        "podSelector": "app=vllm", "demandSource": "gateway"})
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.ExternalScalerStub(ch)
            await asyncio.sleep(0.3)
            assert (await stub.IsActive(ref)).result is False  # no pods, nothing waiting
            gw.pending = 3
            await asyncio.sleep(0.3)
            assert (await stub.IsActive(ref)).result is True  # wakes from zero
            other = pb.ScaledObjectRef(name="so", namespace="llm", scalerMetadata={
                "podSelector": "app=vllm", "demandSource": "undeclared"})
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.IsActive(other)
            assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "'undeclared' is not declared" in (err.value.details() or "")
            gw.prom_value = "7"
            await asyncio.sleep(0.3)
            assert sources.pending("queue") is True
    finally:
        task.cancel()
        await server.stop(0.2)


async def test_failing_source_cannot_wake_and_says_why(gateway: tuple[Gateway, int]) -> None:
    gw, port = gateway
    gw.pending = 5
    gw.status = 503
    gw.prom_value = None
    sources = DemandSources(parse_config(config(port)))
    async with aiohttp.ClientSession() as http:
        for s in sources.config.demand_sources:
            await sources._poll(http, s)
    assert sources.pending("gateway") is False
    assert sources.state()["gateway"] == "ValueError: HTTP 503"
    assert "no series" in sources.state()["queue"]
    assert sources.pending("nope") is None


@pytest.mark.parametrize(("doc", "message"), [
    ([], "configuration: expected a mapping"),
    ({"x": 1}, "unknown key(s) ['x']"),
    ({"interval_s": 0}, "interval_s: expected a number of seconds"),
    ({"demandSources": [{"name": "a b", "url": "http://x", "metric": "m"}]},
     "demandSources[0].name"),
    ({"demandSources": [{"name": "a", "url": "file:///etc/passwd", "metric": "m"}]},
     "demandSources[0].url: an http(s) URL"),
    ({"demandSources": [{"name": "a", "url": "http://x"}]}, "demandSources[0].metric"),
    ({"demandSources": [{"name": "a", "kind": "prometheus", "url": "http://x"}]},
     "demandSources[0].query"),
    ({"demandSources": [{"name": "a", "kind": "sql", "url": "http://x"}]},
     "kind: 'sql' is not one of metrics, prometheus"),
    ({"demandSources": [{"name": "a", "url": "http://x", "metric": "m"},
                        {"name": "a", "url": "http://y", "metric": "m"}]}, "unique"),
])
def test_bad_configs(doc: object, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(doc)
    assert message in str(err.value)
