"""Engine metrics: parsing captured-format bodies, and scraping real HTTP servers."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscale.attribution.model import PodInfo
from gpuscale.engines.scrape import EngineScraper, target_for
from gpuscale.engines.signals import EngineParseError, TritonWindow, engine_signals, samples
from gpuscale.telemetry.model import Absent

DATA = Path(__file__).parent / "data"


def triton_text(a: tuple[float, float], b: tuple[float, float]) -> str:
    text = (DATA / "triton_metrics.txt").read_text()
    for name, value in (("SUCCESS_A", a[0]), ("QUEUE_A", a[1]), ("SUCCESS_B", b[0]),
                        ("QUEUE_B", b[1])):
        text = text.replace(name, repr(value))
    return text


def test_vllm_signals_sum_over_engines() -> None:
    got = engine_signals("vllm", (DATA / "vllm_metrics.txt").read_text(), 0.0)
    assert got == {"vllm-waiting": 7.0, "vllm-running": 21.0, "vllm-requests": 28.0,
                   "vllm-kv-cache": pytest.approx(57.0)}


def test_vllm_old_kv_cache_name_falls_back() -> None:
    got = engine_signals("vllm", (DATA / "vllm_old_metrics.txt").read_text(), 0.0)
    assert got == {"vllm-waiting": 0.0, "vllm-running": 4.0, "vllm-requests": 4.0,
                   "vllm-kv-cache": 25.0}


def test_missing_metrics_are_no_data_never_zero() -> None:
    got = engine_signals("vllm", "# TYPE other gauge\nother 1\n", 0.0)
    assert set(got.values()) == {Absent.NO_DATA}
    assert engine_signals("tgi", "", 0.0) == {"tgi-queue": Absent.NO_DATA,
                                              "tgi-batch": Absent.NO_DATA}


def test_tgi() -> None:
    assert engine_signals("tgi", (DATA / "tgi_metrics.txt").read_text(), 0.0) == {
        "tgi-queue": 6.0, "tgi-batch": 14.0}


def test_triton_queue_time_is_a_windowed_rate_of_counters() -> None:
    w = TritonWindow(window_s=30.0)
    first = w.signals(samples(triton_text((100, 5e5), (50, 2.5e5))), 0.0)
    assert first == {"triton-pending": 9.0, "triton-queue-time": Absent.NO_DATA}
    # 60 more requests waited 1.8 s in total: 30 ms each.
    second = w.signals(samples(triton_text((140, 5e5 + 1.2e6), (70, 2.5e5 + 0.6e6))), 10.0)
    assert second["triton-queue-time"] == pytest.approx(30.0)
    # Nothing completed in the last window: nobody waited.
    later = w.signals(samples(triton_text((140, 1.7e6), (70, 0.85e6))), 50.0)
    assert later["triton-queue-time"] == Absent.NO_DATA  # the window holds one scrape
    quiet = w.signals(samples(triton_text((140, 1.7e6), (70, 0.85e6))), 55.0)
    assert quiet["triton-queue-time"] == 0.0
    # A restarted server (counters back to small numbers) starts a new window.
    restarted = w.signals(samples(triton_text((1, 10), (1, 10))), 60.0)
    assert restarted["triton-queue-time"] == Absent.NO_DATA


@pytest.mark.parametrize("text", ["{{{", "metric{a=\"b\" 1\n", "x{\n",
                                  "# TYPE x gauge\nx notanumber\n"])
def test_garbage_is_a_parse_error(text: str) -> None:
    with pytest.raises(EngineParseError):
        engine_signals("vllm", text, 0.0)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_any_text_gives_signals_or_a_parse_error(text: str) -> None:
    for engine in ("vllm", "triton", "tgi"):
        try:
            got = engine_signals(engine, text, 0.0)
        except EngineParseError:
            continue
        assert all(isinstance(v, Absent) or math.isfinite(v) for v in got.values())


def pod(name: str, port: int, engine: str = "vllm", path: str = "/metrics",
        ip: str = "127.0.0.1") -> PodInfo:
    return PodInfo("llm", name, f"uid-{name}", ip=ip, annotations=(
        ("gpuscale.io/engine", engine), ("gpuscale.io/metrics-path", path),
        ("gpuscale.io/metrics-port", str(port))))


@pytest.mark.parametrize(("info", "expect"), [
    (PodInfo("a", "p", "u", ip="10.1.2.3"), None),
    (pod("p", 8000, ip="10.1.2.3"), "http://10.1.2.3:8000/metrics"),
    (pod("p", 8000, ip="fd00::5"), "http://[fd00::5]:8000/metrics"),
    (pod("p", 8000, engine="sglang"), "'sglang' is not one of vllm, triton, tgi"),
    (pod("p", 70000), "70000 is not a port number"),
    (pod("p", 80, path="http://evil/"), "must be a plain absolute path"),
    (pod("p", 80, path="/m?x=1"), "must be a plain absolute path"),
    (pod("p", 80, ip="vllm.example.com"), "pod has no IP yet"),
    (pod("p", 80, ip=""), "pod has no IP yet"),
])
def test_scrape_targets_only_pod_ips(info: PodInfo, expect: str | None) -> None:
    got = target_for(info)
    if expect is None:
        assert got is None
    elif expect.startswith("http"):
        assert not isinstance(got, str)
        assert got is not None
        assert got.url == expect
    else:
        assert isinstance(got, str)
        assert expect in got


@pytest.fixture
async def engines() -> AsyncIterator[Callable[[web.Application], asyncio.Future[int]]]:
    runners: list[web.AppRunner] = []

    async def serve(app: web.Application) -> int:
        runner = web.AppRunner(app, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        return int(runner.addresses[0][1])

    yield serve  # type: ignore[misc]
    for r in runners:
        await r.cleanup()


def app_returning(body: bytes | Callable[[], bytes], status: int = 200,
                  delay: float = 0.0) -> web.Application:
    async def handler(_: web.Request) -> web.StreamResponse:
        if delay:
            await asyncio.sleep(delay)
        data = body() if callable(body) else body
        return web.Response(body=data, status=status, content_type="text/plain")

    async def redirect(_: web.Request) -> web.StreamResponse:
        raise web.HTTPFound("http://169.254.169.254/")  # must not be followed

    app = web.Application()
    app.router.add_get("/metrics", handler)
    app.router.add_get("/redirect", redirect)
    return app


async def test_scraper_against_real_servers(engines: Callable[..., asyncio.Future[int]]) -> None:
    vllm = (DATA / "vllm_metrics.txt").read_bytes()
    ports = {
        "normal": await engines(app_returning(vllm)),
        "renamed": await engines(app_returning((DATA / "vllm_old_metrics.txt").read_bytes())),
        "missing": await engines(app_returning(b"# TYPE up gauge\nup 1\n")),
        "garbage": await engines(app_returning(b"\x00\xff{{{ not metrics")),
        "huge": await engines(app_returning(lambda: vllm + b"#" * (50 * 1024 * 1024))),
        "silent": await engines(app_returning(vllm, delay=30)),
        "error": await engines(app_returning(b"oops", status=500)),
    }
    pods = {("llm", n): pod(n, p) for n, p in ports.items()}
    pods["llm", "redirect"] = pod("redirect", ports["normal"], path="/redirect")
    pods["llm", "closed"] = pod("closed", 1)  # nothing listens
    scraper = EngineScraper(lambda: pods, timeout=1.0, max_body=1024 * 1024)
    async with aiohttp.ClientSession() as http:
        await asyncio.wait_for(scraper.scrape_once(http), 10)
    got = scraper.readings()
    assert got["llm", "normal"].signals == {"vllm-waiting": 7.0, "vllm-running": 21.0,
                                            "vllm-requests": 28.0,
                                            "vllm-kv-cache": pytest.approx(57.0)}
    assert got["llm", "renamed"].signals["vllm-kv-cache"] == 25.0
    assert set(got["llm", "missing"].signals.values()) == {Absent.NO_DATA}
    for name, why in (("garbage", "not UTF-8"), ("huge", "body over 1048576 bytes"),
                      ("silent", "no answer in 1.0s"), ("error", "HTTP 500"),
                      ("redirect", "HTTP 302"), ("closed", "ClientConnectorError")):
        reading = got["llm", name]
        assert set(reading.signals.values()) == {Absent.UNAVAILABLE}, name
        assert why in reading.error or (name == "garbage" and reading.error), (name,
                                                                              reading.error)


async def test_pods_that_go_away_drop_out(engines: Callable[..., asyncio.Future[int]]) -> None:
    port = await engines(app_returning((DATA / "tgi_metrics.txt").read_bytes()))
    pods = {("llm", "a"): pod("a", port, engine="tgi")}
    scraper = EngineScraper(lambda: pods)
    async with aiohttp.ClientSession() as http:
        await scraper.scrape_once(http)
        assert scraper.readings()["llm", "a"].signals["tgi-queue"] == 6.0
        pods.clear()
        await scraper.scrape_once(http)
    assert scraper.readings() == {}


async def test_a_starting_pod_that_does_not_answer_is_not_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    """A pod that is not Ready yet is loading its model: its closed port reads UNAVAILABLE
    like any other failure, but only a Ready pod's failure is worth a warning."""
    starting = pod("starting", 1)  # PodInfo's default: not Ready
    broken = dataclasses.replace(pod("broken", 1), ready=True)
    pods = {("llm", "starting"): starting, ("llm", "broken"): broken}
    scraper = EngineScraper(lambda: pods, timeout=1.0)
    with caplog.at_level(logging.DEBUG, logger="gpuscale.engines.scrape"):
        async with aiohttp.ClientSession() as http:
            await scraper.scrape_once(http)
    for name in ("starting", "broken"):
        assert set(scraper.readings()["llm", name].signals.values()) == {Absent.UNAVAILABLE}
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert "llm/broken" in warnings[0]
    assert any("llm/starting: not Ready" in r.getMessage() for r in caplog.records
               if r.levelno == logging.DEBUG)
