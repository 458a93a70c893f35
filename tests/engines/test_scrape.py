"""The engine scraper against real HTTP servers on loopback, one per pod: which pods are
scraped, each pod on its own cadence, and the reason each failure gives."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from gpuscale.attribution.model import AttributionState, NodeAttribution, PodInfo
from gpuscale.engines.scrape import EngineScraper, Target, target_for
from gpuscale.telemetry.model import Absent
from tests.engines.engine_peer import VLLM, Engine, holding_gpus, numbered, pod, waiting
from tests.support.polling import until
from tests.support.ports import free_port

U, N = Absent.UNAVAILABLE, Absent.NO_DATA


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
        assert isinstance(got, Target)
        assert got.url == expect
    else:
        assert isinstance(got, str)
        assert expect in got


Serve = Callable[[Engine], Awaitable[int]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Start an Engine on a free loopback port; returns the port."""
    runners: list[web.AppRunner] = []

    async def start(engine: Engine) -> int:
        runner = web.AppRunner(engine.app(), shutdown_timeout=0.1, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        return int(runner.addresses[0][1])

    yield start
    for r in runners:
        await r.cleanup()


@pytest.fixture
async def running() -> AsyncIterator[Callable[[EngineScraper], None]]:
    """Run scrapers' ``run()`` for the test; stop them after."""
    tasks: list[asyncio.Task[None]] = []
    yield lambda s: tasks.append(asyncio.create_task(s.run()))
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_dripping_engine_never_holds_back_the_others(
        serve: Serve, running: Callable[[EngineScraper], None]) -> None:
    """Three healthy engines and one whose /metrics drips a byte every 50 ms. Each round of
    the dripping pod (one request, cut at the timeout), every healthy pod's reading
    advances several times: counted, not timed."""
    names = ("a", "b", "c")
    pods = {("llm", n): pod(n, await serve(Engine(numbered))) for n in names}
    scraper: EngineScraper
    rounds: list[dict[str, float]] = []  # healthy readings as each slow request begins

    def slow_round(_: int) -> None:
        got = scraper.readings()
        rounds.append({n: waiting(got.get(("llm", n))) for n in names})

    slow = Engine(drip=True, on_request=slow_round)
    pods["llm", "slow"] = pod("slow", await serve(slow))
    scraper = EngineScraper(lambda: pods, lambda: holding_gpus(*names, "slow"),
                            interval=0.02, timeout=0.6)
    running(scraper)
    await until(lambda: slow.requests >= 3, what="three rounds of the dripping pod")
    reading = scraper.readings()["llm", "slow"]
    assert reading.error == "no complete answer in 0.6s"
    assert set(reading.signals.values()) == {U}
    for before, after in itertools.pairwise(rounds):
        for n in names:
            assert after[n] >= before[n] + 3, (n, rounds)
    for n in names:
        assert scraper.readings()["llm", n].error == ""


async def test_an_oversized_body_is_refused_with_the_reason(serve: Serve) -> None:
    """2 MiB against the default 1 MiB limit, with and without a Content-Length."""
    big = VLLM + b"#" * (2 * 1024 * 1024)
    scraper = EngineScraper(dict, lambda: None)
    async with scraper.session() as http:
        for engine in (Engine(big), Engine(big, chunked=True)):
            t = target_for(pod("big", await serve(engine)))
            assert isinstance(t, Target)
            got = await scraper.scrape(http, t)
            assert set(got.signals.values()) == {U}
            assert got.error == ("body over 1048576 bytes (the limit is "
                                 "--engine-max-body-bytes)")


@pytest.mark.parametrize(("kind", "path", "why"), [
    ({"status": 503}, "/metrics", "HTTP 503"),
    ({"status": 404}, "/metrics", "HTTP 404"),
    ({}, "/redirect", "HTTP 302 (redirects are not followed)"),
    ({"silent": True}, "/metrics", "no complete answer in 0.5s"),
    ({"body": b"vllm:num_requests_running 2\n\xff\xfe\n"}, "/metrics",
     "body is not UTF-8 (byte 0xff at offset 28)"),
    ({"body": b"# TYPE up gauge\nup 1\nvllm:num_requests_waiting{ 3\n"}, "/metrics",
     "line 3: not Prometheus text format"),
])
async def test_each_failure_says_why(serve: Serve, kind: dict[str, Any], path: str,
                                     why: str) -> None:
    engine = Engine(**kind)
    t = target_for(pod("p", await serve(engine), path=path))
    assert isinstance(t, Target)
    scraper = EngineScraper(dict, lambda: None, timeout=0.5)
    async with scraper.session() as http:
        got = await scraper.scrape(http, t)
    assert set(got.signals.values()) == {U}
    assert got.error.startswith(why), got.error
    assert engine.requests == 1  # the redirect is not followed either


async def test_connection_refused() -> None:
    t = target_for(pod("p", free_port()))  # nothing listens there any more
    assert isinstance(t, Target)
    scraper = EngineScraper(dict, lambda: None)
    async with scraper.session() as http:
        got = await scraper.scrape(http, t)
    assert (set(got.signals.values()), got.error) == ({U}, "connection refused")


@pytest.mark.parametrize(("value", "why"), [
    ("-43", "vllm:num_requests_waiting = -43 (negative)"),
    ("NaN", "vllm:num_requests_waiting = NaN (not a number)"),
    ("+Inf", "vllm:num_requests_waiting = +Inf (infinite, or too large)"),
    ("1e300", "vllm:num_requests_waiting = 1e+300 (above 1000000: not plausible for one "
              "engine pod)"),
    ("9" * 400, "vllm:num_requests_waiting = +Inf (infinite, or too large)"),
])
async def test_hostile_values_over_http(serve: Serve, value: str, why: str) -> None:
    """The engine's nonsense blanks what it touches, with the value in the reason; the
    rest of the pod's signals stay."""
    body = VLLM.replace(b'engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 4.0',
                        b'engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} ' +
                        value.encode())
    t = target_for(pod("p", await serve(Engine(body))))
    assert isinstance(t, Target)
    scraper = EngineScraper(dict, lambda: None)
    async with scraper.session() as http:
        got = await scraper.scrape(http, t)
    assert got.signals == {"vllm-waiting": U, "vllm-running": 21.0, "vllm-requests": U,
                           "vllm-kv-cache": pytest.approx(57.0), "vllm-prompt-tps": N,
                           "vllm-generation-tps": N, "vllm-finished-rate": N}
    assert got.error == why


async def test_only_pods_holding_gpus_here_are_scraped(
        serve: Serve, running: Callable[[EngineScraper], None],
        caplog: pytest.LogCaptureFixture) -> None:
    """An annotated pod without GPUs on this node is never fetched (its server counts
    requests) and the log says why, once; the GPU pod next to it is scraped."""
    gpu, cpu = Engine(numbered), Engine(numbered)
    pods = {("llm", "gpu"): pod("gpu", await serve(gpu)),
            ("llm", "cpu"): pod("cpu", await serve(cpu))}
    scraper = EngineScraper(lambda: pods, lambda: holding_gpus("gpu"), interval=0.02)
    with caplog.at_level(logging.INFO, logger="gpuscale.engines.scrape"):
        running(scraper)
        await until(lambda: gpu.requests >= 10, what="ten scrapes of the GPU pod")
    assert cpu.requests == 0
    assert set(scraper.readings()) == {("llm", "gpu")}
    said = [r.getMessage() for r in caplog.records if "llm/cpu" in r.getMessage()]
    assert said == ["llm/cpu: engine metrics not scraped: annotated gpuscale.io/engine but "
                    "holds no GPU on this node; only pods with GPUs here are scraped"]


async def test_which_pods_follows_the_attribution(caplog: pytest.LogCaptureFixture) -> None:
    """Before the first attribution nothing starts (and nothing is said); while the
    attribution is unavailable the last GPU pods keep their tasks; a pod that leaves the
    attribution, or the node, or changes address, has its task stopped."""
    pods = {("llm", n): pod(n, 8000 + i) for i, n in enumerate(("a", "b", "c"))}
    pods["llm", "noip"] = pod("noip", 8000, ip="")
    att: list[NodeAttribution | None] = [None]
    scraper = EngineScraper(lambda: pods, lambda: att[0])
    started: dict[tuple[str, str], asyncio.Task[None]] = {}

    async def forever() -> None:
        await asyncio.Event().wait()

    def start(key: tuple[str, str], _: Target) -> asyncio.Task[None]:
        started[key] = asyncio.create_task(forever())
        return started[key]

    with caplog.at_level(logging.INFO, logger="gpuscale.engines.scrape"):
        scraper.reconcile(start)
        assert (started, caplog.records) == ({}, [])
        att[0] = holding_gpus("a", "b", "noip")
        scraper.reconcile(start)
        scraper.reconcile(start)
    assert set(started) == set(scraper.targets()) == {("llm", "a"), ("llm", "b")}
    said = [(r.levelno, r.getMessage().split(":")[0]) for r in caplog.records]
    assert sorted(said) == [(logging.INFO, "llm/c"), (logging.WARNING, "llm/noip")]  # once
    # A GPU pod that cannot be scraped reads UNAVAILABLE, and says why.
    noip = scraper.readings()["llm", "noip"]
    assert (set(noip.signals.values()), noip.error) == ({U}, "pod has no IP yet")
    att[0] = NodeAttribution(AttributionState.UNAVAILABLE, ("kubelet pod resources gone",))
    scraper.reconcile(start)
    assert set(scraper.targets()) == {("llm", "a"), ("llm", "b")}
    first_b = started["llm", "b"]
    att[0] = holding_gpus("b", "c")
    pods["llm", "b"] = dataclasses.replace(pods["llm", "b"], ip="127.0.0.2")
    scraper.reconcile(start)
    await asyncio.sleep(0)  # let the cancellations land
    assert set(scraper.targets()) == {("llm", "b"), ("llm", "c")}
    assert scraper.targets()["llm", "b"].url == "http://127.0.0.2:8001/metrics"
    assert started["llm", "a"].cancelled()
    assert first_b.cancelled()
    assert ("llm", "noip") not in scraper.readings()  # no longer holds a GPU here
    del pods["llm", "c"]
    scraper.reconcile(start)
    await asyncio.sleep(0)
    assert set(scraper.targets()) == {("llm", "b")}
    assert started["llm", "c"].cancelled()
    for t in started.values():
        t.cancel()


async def test_pods_that_go_away_drop_out_and_stop_being_fetched(
        serve: Serve, running: Callable[[EngineScraper], None]) -> None:
    stays, leaves = Engine(numbered), Engine(numbered)
    pods = {("llm", "stays"): pod("stays", await serve(stays)),
            ("llm", "leaves"): pod("leaves", await serve(leaves))}
    scraper = EngineScraper(lambda: pods, lambda: holding_gpus(*(k[1] for k in pods)),
                            interval=0.02)
    running(scraper)
    await until(lambda: ("llm", "leaves") in scraper.readings(), what="a first reading")
    del pods["llm", "leaves"]
    await until(lambda: ("llm", "leaves") not in scraper.readings(), what="the pod dropped")
    assert set(scraper.targets()) == {("llm", "stays")}
    mark = stays.requests
    await until(lambda: stays.requests >= mark + 2, what="two more rounds")
    after = leaves.requests  # a request in flight when the pod left has landed by now
    await until(lambda: stays.requests >= mark + 7, what="five more rounds")
    assert leaves.requests == after
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "engine-scrape llm/leaves"]


async def test_a_starting_pod_that_does_not_answer_is_not_a_warning(
        running: Callable[[EngineScraper], None], caplog: pytest.LogCaptureFixture) -> None:
    """A pod that is not Ready yet is loading its model: its closed port reads UNAVAILABLE
    like any other failure, but only a Ready pod's failure is worth a warning."""
    closed = free_port()
    pods = {("llm", "starting"): pod("starting", closed, ready=False),
            ("llm", "broken"): pod("broken", closed)}
    scraper = EngineScraper(lambda: pods, lambda: holding_gpus("starting", "broken"),
                            interval=0.02)
    with caplog.at_level(logging.DEBUG, logger="gpuscale.engines.scrape"):
        running(scraper)
        await until(lambda: len(scraper.readings()) == 2, what="both pods read")
    for name in ("starting", "broken"):
        reading = scraper.readings()["llm", name]
        assert (set(reading.signals.values()), reading.error) == ({U}, "connection refused")
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert "llm/broken" in warnings[0]
    assert any("llm/starting: not Ready" in r.getMessage() for r in caplog.records
               if r.levelno == logging.DEBUG)


async def test_a_pod_going_away_or_starting_without_its_gpu_is_not_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    """Scaling down, a pod is deleted (or turns not Ready) and its engine stops before the
    agent's next round stops its scrapes; scaling up, a new pod is listed before it holds
    its GPU. Both are expected (debug); a Ready pod's refusal is still a warning, and every
    reading still says why."""
    closed = free_port()
    pods = {("llm", n): pod(n, closed) for n in ("leaving", "terminating", "broken")}
    pods["llm", "new"] = pod("new", closed, ready=False)
    scraper = EngineScraper(lambda: pods, lambda: holding_gpus("leaving", "terminating",
                                                               "broken"))
    with caplog.at_level(logging.DEBUG, logger="gpuscale.engines.scrape"):
        scraper.reconcile(lambda k, t: asyncio.create_task(asyncio.sleep(0)))
        targets = scraper.targets()
        del pods["llm", "leaving"]
        pods["llm", "terminating"] = dataclasses.replace(pods["llm", "terminating"],
                                                         ready=False)
        async with scraper.session() as http:
            for t in targets.values():
                assert (await scraper.scrape(http, t)).error == "connection refused"
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert [w.split(":")[0] for w in warnings] == ["llm/broken"]
    quiet = [r.getMessage().split(":")[0] for r in caplog.records
             if r.levelno == logging.DEBUG]
    assert sorted(quiet) == ["llm/leaving", "llm/new", "llm/terminating"]


async def test_a_reading_recovers_and_the_log_says_so(
        serve: Serve, running: Callable[[EngineScraper], None],
        caplog: pytest.LogCaptureFixture) -> None:
    """HTTP 503 on the first two requests, then good answers: one warning, one 'again'."""
    engine = Engine(status=lambda n: 503 if n <= 2 else 200)
    pods = {("llm", "p"): pod("p", await serve(engine))}
    scraper = EngineScraper(lambda: pods, lambda: holding_gpus("p"), interval=0.02)
    with caplog.at_level(logging.INFO, logger="gpuscale.engines.scrape"):
        running(scraper)
        await until(lambda: engine.requests >= 4, what="four scrapes")
    messages = [r.getMessage() for r in caplog.records]
    assert sum("HTTP 503" in m for m in messages) == 1
    assert sum("readable again" in m for m in messages) == 1
    reading = scraper.readings()["llm", "p"]
    assert (reading.signals["vllm-requests"], reading.error) == (28.0, "")


async def test_a_bad_value_that_changes_every_scrape_is_logged_once(
        serve: Serve, caplog: pytest.LogCaptureFixture) -> None:
    engine = Engine(lambda n: f"vllm:num_requests_waiting -{n}\n".encode())
    info = pod("p", await serve(engine))
    t = target_for(info)
    assert isinstance(t, Target)
    scraper = EngineScraper(lambda: {("llm", "p"): info}, lambda: None)  # Ready, listed
    with caplog.at_level(logging.INFO, logger="gpuscale.engines.scrape"):
        async with scraper.session() as http:
            errors = [(await scraper.scrape(http, t)).error for _ in range(3)]
    assert errors == [f"vllm:num_requests_waiting = -{n} (negative)" for n in (1, 2, 3)]
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 1
    assert logged[0].endswith(": vllm:num_requests_waiting = -1 (negative)")


@pytest.mark.parametrize(("answer", "why"), [
    (b"", "no HTTP answer: "),
    (b"SSH-2.0-OpenSSH_9.6\r\n", "no HTTP answer: "),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\nvllm:num_requests_waiting 1\n",
     "body cut short: "),
])
async def test_an_engine_that_is_no_http_server_or_hangs_up_says_so(answer: bytes,
                                                                    why: str) -> None:
    """Raw answers no HTTP server library would send: nothing, not HTTP, a short body."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    t = target_for(pod("p", server.sockets[0].getsockname()[1]))
    assert isinstance(t, Target)
    scraper = EngineScraper(dict, lambda: None)
    async with server, scraper.session() as http:
        got = await scraper.scrape(http, t)
    assert set(got.signals.values()) == {U}
    assert got.error.startswith(why), got.error


async def test_engines_cookies_are_not_kept(serve: Serve) -> None:
    """A scrape carries no session: whatever an engine sets is dropped, not collected."""
    class Setter(Engine):
        async def handle(self, request: web.Request) -> web.StreamResponse:
            resp = await super().handle(request)
            resp.set_cookie(f"c{self.requests}", "x" * 1000)
            return resp

    t = target_for(pod("p", await serve(Setter())))
    assert isinstance(t, Target)
    scraper = EngineScraper(dict, lambda: None)
    async with scraper.session() as http:
        for _ in range(3):
            assert (await scraper.scrape(http, t)).error == ""
        assert len(http.cookies.jar) == 0
