"""Demand sources: operator-declared pending work that wakes a workload from zero."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscale.common.errors import ConfigError, DataUnavailable, PeerError
from gpuscale.proto import externalscaler_pb2 as pb
from gpuscale.proto import externalscaler_pb2_grpc as pb_grpc
from gpuscale.scaler.answers import Answers
from gpuscale.scaler.edges.keda import ScalerServer, ScalerService
from gpuscale.scaler.sources import demand
from gpuscale.scaler.sources.demand import DemandSources, parse_config, query_result
from gpuscale.scaler.state.fleet import FleetView
from tests.support.polling import until
from tests.support.ports import free_port


class Gateway:
    """A real HTTP server: a gateway's /metrics and a Prometheus-style query API. ``raw``
    replaces the query API's JSON answer with any body (hostile replies)."""

    def __init__(self) -> None:
        self.pending = 0.0
        self.prom_value: str | None = "0"
        self.status = 200
        self.raw: bytes | None = None

    async def metrics(self, _: web.Request) -> web.Response:
        text = ("# TYPE gateway_pending_requests gauge\n"
                f'gateway_pending_requests{{model="llama"}} {self.pending}\n'
                'gateway_pending_requests{model="other"} 50\n')
        return web.Response(text=text, status=self.status)

    async def query(self, request: web.Request) -> web.Response:
        assert request.query["query"] == "sum(queue_depth)"
        if self.raw is not None:
            return web.Response(body=self.raw, content_type="application/json")
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


async def answer(stub: pb_grpc.ExternalScalerStub, ref: pb.ScaledObjectRef) -> bool | str:
    """IsActive's result, or the status code's name when it failed."""
    try:
        return bool((await stub.IsActive(ref)).result)
    except grpc.aio.AioRpcError as exc:
        return f"{exc.code().name}: {exc.details()}"


async def test_scale_from_zero_with_pending_work(gateway: tuple[Gateway, int]) -> None:
    gw, port = gateway
    sources = DemandSources(parse_config(config(port)))
    task = asyncio.create_task(sources.run())
    server = ScalerServer(ScalerService(Answers(FleetView(), demand=sources.pending)),
                          host="127.0.0.1", port=0)
    await server.start()
    ref = pb.ScaledObjectRef(name="so", namespace="llm", scalerMetadata={
        "podSelector": "app=vllm", "demandSource": "gateway"})
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.ExternalScalerStub(ch)
            # no pods, nothing waiting (once the source has answered)
            assert await until(lambda: _is(answer(stub, ref), False), what="inactive")
            gw.pending = 3
            assert await until(lambda: _is(answer(stub, ref), True), what="wakes from zero")
            other = pb.ScaledObjectRef(name="so", namespace="llm", scalerMetadata={
                "podSelector": "app=vllm", "demandSource": "undeclared"})
            got = await answer(stub, other)
            assert isinstance(got, str)
            assert got.startswith("INVALID_ARGUMENT")
            assert "'undeclared' is not declared" in got
            gw.prom_value = "7"
            await until(lambda: _pending(sources, "queue"), what="queue shows work")
    finally:
        task.cancel()
        await server.stop(0.2)


async def _is(result: Any, want: bool | str) -> bool:
    got = await result
    return got is want if isinstance(want, bool) else str(got).startswith(want)


def _pending(sources: DemandSources, name: str) -> bool:
    try:
        return sources.pending(name)
    except DataUnavailable:
        return False


async def test_failing_source_is_unavailable_and_says_why(gateway: tuple[Gateway, int]) -> None:
    gw, port = gateway
    gw.pending = 5
    gw.status = 503
    gw.prom_value = None
    sources = DemandSources(parse_config(config(port)))
    with pytest.raises(DataUnavailable, match="gateway: no answer yet"):
        sources.pending("gateway")
    async with sources.session() as http:
        for s in sources.config.demand_sources:
            await sources._poll(http, s)
    with pytest.raises(DataUnavailable, match="HTTP 503"):
        sources.pending("gateway")  # cannot tell: not "no work"
    assert sources.state()["gateway"] == "ValueError: HTTP 503"
    assert "no series" in sources.state()["queue"]
    with pytest.raises(ConfigError, match="not declared"):
        sources.pending("nope")


async def test_failed_requests_are_reasons_that_make_the_source_unavailable(
        gateway: tuple[Gateway, int], monkeypatch: pytest.MonkeyPatch) -> None:
    """What the HTTP client raises stays in the adapter: each failure is the source's
    reading, in words, and the source cannot tell (UNAVAILABLE, never "no work")."""
    gw, port = gateway
    gw.pending = 5

    async def silent(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await asyncio.sleep(10)
        w.close()

    quiet = await asyncio.start_server(silent, "127.0.0.1", 0)
    monkeypatch.setattr(demand, "MAX_BODY", 100)  # the gateway's body is ~150 bytes
    urls = {"refused": f"http://127.0.0.1:{free_port()}/metrics",
            "bad-port": "http://127.0.0.1:99999/metrics",
            "silent": f"http://127.0.0.1:{quiet.sockets[0].getsockname()[1]}/metrics",
            "too-large": f"http://127.0.0.1:{port}/metrics"}
    sources = DemandSources(parse_config({"timeout_s": 0.3, "demandSources": [
        {"name": name, "url": url, "metric": "gateway_pending_requests"}
        for name, url in urls.items()]}))
    try:
        async with sources.session() as http:
            await asyncio.gather(*(sources._poll(http, s)
                                   for s in sources.config.demand_sources))
    finally:
        quiet.close()
    assert sources.state() == {
        "refused": "PeerError: connection refused",
        "bad-port": "ValueError: Port out of range 0-65535",
        "silent": "PeerError: no complete answer in 0.3 s",
        "too-large": "BodyTooLarge: body over 100 bytes"}
    for name in urls:
        with pytest.raises(DataUnavailable, match=f"demand source {name}: "):
            sources.pending(name)


HOSTILE = [b"null", b"[]", b"{}", b'"success"', b"7", b'{"status": "success"}',
           b'{"status": "success", "data": null}',
           b'{"status": "success", "data": {"resultType": "vector", "result": null}}',
           b'{"status": "success", "data": {"resultType": "vector", "result": [null]}}',
           b'{"status": "success", "data": {"resultType": "vector", "result": [{}]}}',
           b'{"status": "success", "data": {"resultType": "vector", '
           b'"result": [{"value": [0, "-3"]}]}}',
           b'{"status": "success", "data": {"resultType": "vector", '
           b'"result": [{"value": [0, "NaN"]}]}}',
           b'{"status": "success", "data": {"resultType": "scalar", "result": [0, 5]}}',
           b'{"status": "success", "data": {"resultType": "matrix", "result": []}}',
           b'{"status": "error", "error": "bad query"}', b"not json", b"\xff\xfe",
           b"[" * 100_000 + b"]" * 100_000]  # nested past what json.loads can recurse


@pytest.mark.parametrize("body", HOSTILE)
async def test_hostile_query_replies_make_only_dependent_workloads_unavailable(
        gateway: tuple[Gateway, int], body: bytes) -> None:
    """A reply that is not a count keeps the poller alive (it is retried), makes the
    workload that depends on the source UNAVAILABLE with the reason, and leaves a workload
    on another source answering; a good reply brings it back."""
    gw, port = gateway
    gw.raw = body
    gw.pending = 0
    sources = DemandSources(parse_config(config(port)))
    task = asyncio.create_task(sources.run())
    server = ScalerServer(ScalerService(Answers(FleetView(), demand=sources.pending)),
                          host="127.0.0.1", port=0)
    await server.start()
    on_queue = pb.ScaledObjectRef(name="a", namespace="llm", scalerMetadata={
        "podSelector": "app=a", "demandSource": "queue"})
    on_gateway = pb.ScaledObjectRef(name="b", namespace="llm", scalerMetadata={
        "podSelector": "app=b", "demandSource": "gateway"})
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.ExternalScalerStub(ch)
            assert await until(lambda: _is(answer(stub, on_gateway), False),
                               what="the other source's workload answers")
            await until(lambda: _is(answer(stub, on_queue), "UNAVAILABLE"),
                        what="unavailable")
            got = await answer(stub, on_queue)
            assert "llm/a: demand source queue" in str(got)
            assert not task.done()  # the poller lives on
            gw.raw = None
            gw.prom_value = "2"
            assert await until(lambda: _is(answer(stub, on_queue), True), what="recovers")
    finally:
        task.cancel()
        await server.stop(0.2)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["status", "data", "resultType", "result", "value", "error"]),
        inner, max_size=4), max_leaves=12)


@given(json_values)
@settings(max_examples=300, deadline=None)
def test_query_result_raises_only_peer_error(body: object) -> None:
    try:
        value = query_result(body)
    except PeerError:
        return
    assert math.isfinite(value)
    assert value >= 0


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
