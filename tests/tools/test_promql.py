"""The Prometheus seam of ``gpuscale idle`` against an HTTP peer on loopback that answers
what a broken, hostile or unrelated server would; and the CLI's message for each."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web

from gpuscale.common.errors import ConfigError
from gpuscale.tools.client import ToolError
from gpuscale.tools.promql import Prometheus, check_url, read_devices, step_for
from tests.support.ports import free_port

Answer = Callable[[web.Request], Any]


def empty(r: web.Request) -> web.Response:
    """An empty Prometheus: no series for any query."""
    return web.json_response({"status": "success", "data": {
        "resultType": "matrix" if r.path.endswith("query_range") else "vector", "result": []}})


class Peer:
    """Answers every request with ``self.answer(request)`` (a coroutine's result)."""

    def __init__(self) -> None:
        self.answer: Answer = empty
        self.queries: list[dict[str, str]] = []
        self.url = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.queries.append(dict(request.query))
        got = self.answer(request)
        return await got if asyncio.iscoroutine(got) else got  # type: ignore[no-any-return]


@pytest.fixture
async def peer() -> AsyncIterator[Peer]:
    p = Peer()
    app = web.Application()
    app.router.add_get("/{tail:.*}", p.handle)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    p.url = f"http://127.0.0.1:{port}/prom/"
    yield p
    await runner.cleanup()


async def _range(prom: Prometheus) -> Any:
    async with prom.session() as s:
        return await prom.range(s, "up", 0.0, 60.0, 60.0)


async def test_a_good_reply_and_what_was_asked(peer: Peer) -> None:
    peer.answer = lambda r: web.json_response({"status": "success", "data": {
        "resultType": "matrix", "result": [
            {"metric": {"UUID": "GPU-1", "Hostname": "n"}, "values": [[60, "1"], [120, "NaN"]]}]}})
    got = await _range(Prometheus(peer.url))
    assert [(dict(s.labels), s.points) for s in got] == [
        ({"UUID": "GPU-1", "Hostname": "n"}, ((60.0, 1.0),))]  # NaN is no point
    assert peer.queries[-1] == {"query": "up", "start": "0.000", "end": "60.000", "step": "60"}


@pytest.mark.parametrize(("answer", "says"), [
    (lambda r: web.json_response({"status": "error", "errorType": "bad_data",
                                  "error": "parse error at char 3"}, status=400),
     "refused the query (HTTP 400, bad_data): parse error at char 3"),
    (lambda r: web.Response(text="<html>login</html>", content_type="text/html"),
     "not the query API's JSON (text/html"),
    (lambda r: web.json_response({"status": "success", "data": {"resultType": "vector",
                                                                 "result": []}}),
     "expected a matrix"),
    (lambda r: web.json_response({"status": "success", "data": {"resultType": "matrix",
                                                                 "result": [{"metric": {},
                                                                             "values": [[1]]}]}}),
     "not [time, \"value\"]"),
    (lambda r: web.json_response({"status": "success", "data": []}), "no data object"),
    (lambda r: web.Response(status=302, headers={"Location": "http://elsewhere/"}),
     "HTTP 302"),
    (lambda r: web.Response(body=b"x" * 5000), "over 4096 bytes"),
    (lambda r: web.Response(body=b"[" * 2000 + b"]" * 2000,  # deeper than json can recurse
                            content_type="application/json"), "not the query API's JSON"),
])
async def test_bad_replies_are_clear_errors(peer: Peer, answer: Answer, says: str) -> None:
    peer.answer = answer
    with pytest.raises(ToolError) as info:
        await _range(Prometheus(peer.url, max_body=4096))
    assert says in str(info.value)


async def test_a_silent_server_times_out(peer: Peer) -> None:
    async def slow(_: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.Response()

    peer.answer = slow
    with pytest.raises(ToolError, match=r"did not answer within 0\.3 s"):
        await _range(Prometheus(peer.url, timeout_s=0.3))


async def test_nothing_listening() -> None:
    with pytest.raises(ToolError, match="could not be reached"):
        await _range(Prometheus(f"http://127.0.0.1:{free_port()}"))


async def test_a_port_out_of_range_is_a_tool_error() -> None:
    """Not the bare ExceptionGroup httpx2 would raise from its connect."""
    with pytest.raises(ToolError, match=r"could not be reached \(Port out of range"):
        await _range(Prometheus("http://127.0.0.1:99999"))


def test_urls_and_steps() -> None:
    assert check_url("https://prom.example:9090/x/") == "https://prom.example:9090/x"
    for bad in ("prom:9090", "ftp://x", "http://", "http://x/?q=1"):
        with pytest.raises(ConfigError):
            check_url(bad)
    assert step_for(3600) == 60
    assert step_for(31 * 86400) == 300  # under Prometheus's 11,000 points a series


async def test_buckets_line_up_with_the_scalers_minutes(peer: Peer) -> None:
    await read_devices(Prometheus(peer.url), 1_800_000_030.0, 600.0)
    ranges = [q for q in peer.queries if "step" in q]
    assert {(q["start"], q["end"], q["step"]) for q in ranges} == {
        ("1799999460.000", "1800000060.000", "60")}


async def _cli(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpuscale.cli", "idle", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_the_cli_says_what_went_wrong(peer: Peer) -> None:
    code, out, err = await _cli("--prometheus", f"http://127.0.0.1:{free_port()}")
    assert (code, out) == (1, "")
    assert "could not be reached" in err
    peer.answer = lambda r: web.json_response({"status": "error", "errorType": "timeout",
                                               "error": "query timed out"}, status=503)
    code, out, err = await _cli("--prometheus", peer.url)
    assert (code, out) == (1, "")
    assert "refused the query (HTTP 503, timeout)" in err
    peer.answer = lambda r: web.Response(body=json.dumps({"status": "success"}).encode()[:9])
    code, out, err = await _cli("--prometheus", peer.url)
    assert code == 1
    assert "not the query API's JSON" in err
    code, out, err = await _cli("--prometheus", "prometheus:9090")
    assert code == 2
    assert "is not a Prometheus URL" in err
    assert "Traceback" not in err
    # An empty Prometheus: a report with nothing in it, and why.
    peer.answer = empty
    code, out, err = await _cli("--prometheus", peer.url, "--json")
    assert code == 0
    assert json.loads(out)["devices"] == 0
    assert "no DCGM_FI_DEV_FB_USED series" in err
