"""The agent's engine wiring end to end in-process: simulated GPUs, attribution from a
fixed allocation, and real HTTP engine servers on loopback, one per pod."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from pathlib import Path

import pytest
from aiohttp import web

from gpuscale.agent.app import Agent, AgentConfig
from gpuscale.attribution.devices import parse_device_id
from gpuscale.attribution.model import Allocation, PodInfo, PodPhase
from gpuscale.attribution.sources import AttributionInputs
from gpuscale.cli import main
from gpuscale.stream.codec import decode, encode_report
from gpuscale.stream.records import DeviceRecord, NodeReport, PodRecord
from gpuscale.telemetry.model import Absent, NodeSnapshot
from gpuscale.telemetry.scenario import gpu_uuid, load_scenario
from gpuscale.telemetry.simulated_gpus import SimulatedBackend
from tests.support.polling import until

VLLM = (Path(__file__).parents[1] / "engines" / "data" / "vllm_metrics.txt").read_bytes()
RATES = ("vllm-prompt-tps", "vllm-generation-tps", "vllm-finished-rate")


class CountingEngine:
    """A pod's /metrics: ``body`` (of the request number, from 1) on every request,
    counted."""

    def __init__(self, body: bytes | Callable[[int], bytes]) -> None:
        self.body = body
        self.requests = 0

    async def handle(self, _: web.Request) -> web.Response:
        self.requests += 1
        body = self.body(self.requests) if callable(self.body) else self.body
        return web.Response(body=body, content_type="text/plain")


def serving(n: int) -> bytes:
    """VLLM (whose prompt counter stays put) with counters that grow on every request: 100
    generated tokens and 3 finished requests (2 stop, 1 length) per request."""
    labels = 'engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"'
    return VLLM + (
        "# TYPE vllm:generation_tokens counter\n"
        f"vllm:generation_tokens_total{{{labels}}} {100 * n}.0\n"
        "# TYPE vllm:request_success counter\n"
        f'vllm:request_success_total{{{labels},finished_reason="stop"}} {2 * n}.0\n'
        f'vllm:request_success_total{{{labels},finished_reason="length"}} {n}.0\n'
    ).encode()


class FixedSources:
    """Attribution inputs of one node: ``gpu_pods`` hold GPU 0, 1, ...; every pod in
    ``pods`` is on the node."""

    def __init__(self, node: str, pods: Mapping[tuple[str, str], PodInfo],
                 gpu_pods: Iterable[str]) -> None:
        self._pods = dict(pods)
        self._allocations = tuple(
            Allocation("llm", name, "engine", "nvidia.com/gpu",
                       (parse_device_id(gpu_uuid(node, i)),))
            for i, name in enumerate(gpu_pods))

    async def gather(self, snapshot: NodeSnapshot) -> AttributionInputs:
        return AttributionInputs(self._allocations, time.time(), self._pods, {}, ())

    async def run(self) -> None:
        await asyncio.Event().wait()

    async def close(self) -> None:
        pass

    def pod_infos(self) -> Mapping[tuple[str, str], PodInfo] | Absent:
        return self._pods


class Records:
    def __init__(self) -> None:
        self.latest: dict[str, PodRecord] = {}

    def update_node(self, source: str, records: Iterable[PodRecord],
                    devices: Sequence[DeviceRecord] | None = None,
                    stale_after: float = 0.0) -> None:
        self.latest = {r.name: r for r in records}

    def remove_node(self, source: str) -> None:
        self.latest = {}


@pytest.fixture
async def engines() -> AsyncIterator[dict[str, tuple[CountingEngine, int]]]:
    """Three engine pods: 'small' (serving: its counters grow) and 'large' (8 KiB) hold
    GPUs, 'cpu' holds none."""
    out: dict[str, tuple[CountingEngine, int]] = {}
    runners = []
    bodies: tuple[tuple[str, bytes | Callable[[int], bytes]], ...] = (
        ("small", serving), ("large", VLLM + b"#" * 8192), ("cpu", VLLM))
    for name, body in bodies:
        engine = CountingEngine(body)
        app = web.Application()
        app.router.add_get("/metrics", engine.handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        out[name] = (engine, int(runner.addresses[0][1]))
    yield out
    for r in runners:
        await r.cleanup()


async def test_agent_scrapes_only_its_gpu_pods_within_the_body_limit(
        engines: dict[str, tuple[CountingEngine, int]]) -> None:
    node = load_scenario("h100-vllm").nodes[0]
    pods = {("llm", name): PodInfo(
        "llm", name, f"uid-{name}", phase=PodPhase.RUNNING, ready=True, ip="127.0.0.1",
        annotations=(("gpuscale.io/engine", "vllm"), ("gpuscale.io/metrics-port", str(port))))
        for name, (_, port) in engines.items()}
    agent = Agent(SimulatedBackend(node), AgentConfig(host="127.0.0.1", port=0, interval=0.2,
                                                      engine_max_body=4096),
                  FixedSources(node.name, pods, ["small", "large"]))
    records = Records()
    agent.add_sink(records)
    task = asyncio.create_task(agent.run())
    try:
        def small_read() -> bool:
            r = records.latest.get("small")
            return r is not None and r.signals.get("vllm-waiting") == 7.0 and \
                isinstance(r.signals.get("vllm-finished-rate"), float)

        await until(small_read, what="the GPU pod's engine signals and rates in its record")
        small_rates = {s: records.latest["small"].signals[s] for s in RATES}
        small, _ = engines["small"]
        seen = small.requests
        await until(lambda: small.requests >= seen + 3, what="three more scrapes")
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert engines["cpu"][0].requests == 0  # annotated, but holds no GPU here
    assert set(records.latest) == {"small", "large"}
    large = records.latest["large"].signals
    assert {large[s] for s in ("vllm-waiting", "vllm-kv-cache")} == {Absent.UNAVAILABLE}
    assert agent.engines is not None
    assert agent.engines.readings()["llm", "large"].error.startswith("body over 4096 bytes")
    # ... and the reason travels with the record (to the scaler's UNAVAILABLE message).
    assert records.latest["large"].reasons["vllm-waiting"].startswith("body over 4096 bytes")
    assert "vllm-waiting" not in records.latest["small"].reasons
    # Rates over one scrape interval: the prompt counter did not move; the other two grew
    # 100 : 3 on every request, whatever the interval.
    prompt, generated, finished = (small_rates[s] for s in RATES)
    assert prompt == 0.0
    assert isinstance(generated, float)
    assert isinstance(finished, float)
    assert generated > 0
    assert finished / generated == pytest.approx(0.03)
    assert {large[s] for s in RATES} == {Absent.UNAVAILABLE}
    update = encode_report(NodeReport("n", 1, 0.0, 1.0, tuple(records.latest.values())),
                           "id", 0.0)
    back = {r.name: r for r in decode(update, 5.0, 3.0)}
    assert back["large"].reasons == {k: v[:200] for k, v in
                                     records.latest["large"].reasons.items()}
    assert back["large"].signals["vllm-waiting"] is Absent.UNAVAILABLE
    assert {s: back["small"].signals[s] for s in RATES} == {
        s: records.latest["small"].signals[s] for s in RATES}


@pytest.mark.parametrize("value", ["10", "100000000"])
def test_engine_body_limit_flag_is_checked(value: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["agent", "--gpu-backend", "sim", "--stream-port", "-1",
                 "--engine-max-body-bytes", value])
    assert code == 2
    assert (f"--engine-max-body-bytes must be between 4096 and 67108864, got {value}"
            in capsys.readouterr().err)
