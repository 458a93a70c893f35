"""Simulated inference engines for the demo: each scenario pod with an ``engine`` serves
``/metrics`` in its engine's real format at the pod's (loopback) IP, with numbers that
follow the process's simulated load. The agent scrapes them like real pods.

The load -> queue mapping is deliberately simple and only meant to make the demo move:
a replica runs a batch proportional to its load (up to 64 for vLLM, 32 for TGI), requests
start to queue above 75 % load (20 waiting at 100 %), vLLM's KV cache fills from 15 % to
95 %, and Triton completes 2 requests/s per load-percent with a queue time that grows above
70 %. vLLM's counters grow with its running requests: each generates
``VLLM_DECODE_TPS`` tokens/s and finishes after ``VLLM_OUTPUT_TOKENS``, and each finished
request had read ``VLLM_PROMPT_TOKENS`` (so at load L: 64 L/100 x 30 generated tokens/s,
a 256th of that in finished requests/s, 512 prompt tokens per finished request); 90 % end
on a stop token, the rest at their length limit. Counters advance with scenario time, so
at ``--speed`` N the rates an agent sees (per second of its own clock) are N times the
scenario's. The control-model issue replaces this with a serving model fed by a real trace.
"""

from __future__ import annotations

import asyncio
import math
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web

from gpuscale.attribution.model import PodInfo
from gpuscale.engines.scrape import ANNOTATION, PORT_ANNOTATION
from gpuscale.engines.vllm_body import unread_families
from gpuscale.telemetry.load import LoadCurve

VLLM_DECODE_TPS = 30.0  # tokens/s each running request generates
VLLM_OUTPUT_TOKENS = 256.0
VLLM_PROMPT_TOKENS = 512.0


def _queue(load: float) -> float:
    return max(0.0, (load - 75.0) / 25.0 * 20.0)


@dataclass(frozen=True, slots=True)
class VllmCounters:
    """vLLM's counters since the engine started (``vllm:prompt_tokens_total``,
    ``vllm:generation_tokens_total``, ``vllm:request_success_total``)."""

    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    finished: float = 0.0

    def after(self, running: int, dt: float) -> VllmCounters:
        """The counters ``dt`` seconds later, ``running`` requests having run meanwhile."""
        generated = running * VLLM_DECODE_TPS * max(0.0, dt)
        done = generated / VLLM_OUTPUT_TOKENS
        return VllmCounters(self.prompt_tokens + done * VLLM_PROMPT_TOKENS,
                            self.generation_tokens + generated, self.finished + done)


@dataclass
class _Triton:
    success: float = 0.0
    queue_us: float = 0.0
    last: float | None = None


@dataclass
class SimulatedEngine:
    pod: PodInfo
    engine: str
    load: LoadCurve
    triton: _Triton = field(default_factory=_Triton)
    vllm: VllmCounters = field(default_factory=VllmCounters)
    vllm_last: float | None = None  # scenario time of the last render

    def render(self, t: float) -> str:
        load = self.load.at(t)
        if self.engine == "vllm":
            running = round(load / 100 * 64)
            if self.vllm_last is not None and t > self.vllm_last:
                self.vllm = self.vllm.after(running, t - self.vllm_last)
            self.vllm_last = t if self.vllm_last is None else max(t, self.vllm_last)
            return vllm_metrics(self.pod.name.rsplit("-", 1)[0], running,
                                round(_queue(load)), 0.15 + 0.8 * load / 100,
                                self.vllm) + unread_families()
        if self.engine == "tgi":
            return ("# TYPE tgi_queue_size gauge\n"
                    f"tgi_queue_size {round(_queue(load))}\n"
                    "# TYPE tgi_batch_current_size gauge\n"
                    f"tgi_batch_current_size {round(load / 100 * 32)}\n")
        tr = self.triton
        if tr.last is not None and t > tr.last:
            done = 2.0 * load * (t - tr.last)
            tr.success += done
            tr.queue_us += done * (1.0 + max(0.0, load - 70.0) * 3.0) * 1000.0
        tr.last = t
        model = f'model="{self.pod.name.rsplit("-", 1)[0]}",version="1"'
        return ("# TYPE nv_inference_request_success counter\n"
                f"nv_inference_request_success{{{model}}} {tr.success:.0f}\n"
                "# TYPE nv_inference_queue_duration_us counter\n"
                f"nv_inference_queue_duration_us{{{model}}} {tr.queue_us:.0f}\n"
                "# TYPE nv_inference_pending_request_count gauge\n"
                f"nv_inference_pending_request_count{{{model}}} {round(_queue(load))}\n")


def vllm_metrics(model: str, running: int, waiting: int, kv_fraction: float,
                 counters: VllmCounters | None = None) -> str:
    """vLLM's /metrics text (v1 names) for one engine; the counters (as whole numbers, the
    way vLLM counts them) only when given."""
    labels = f'engine="0",model_name="{model}"'
    text = ("# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{{{labels}}} {running}\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            f"vllm:num_requests_waiting{{{labels}}} {waiting}\n"
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            f"vllm:kv_cache_usage_perc{{{labels}}} {kv_fraction:.4f}\n")
    if counters is None:
        return text
    # Each part rounded down on its own: every series, and so their sum, only grows.
    stop = math.floor(0.9 * counters.finished)
    length = math.floor(0.1 * counters.finished)
    return (text +
            "# TYPE vllm:prompt_tokens counter\n"
            f"vllm:prompt_tokens_total{{{labels}}} {math.floor(counters.prompt_tokens)}.0\n"
            "# TYPE vllm:generation_tokens counter\n"
            f"vllm:generation_tokens_total{{{labels}}} "
            f"{math.floor(counters.generation_tokens)}.0\n"
            "# TYPE vllm:request_success counter\n"
            f'vllm:request_success_total{{{labels},finished_reason="stop"}} {stop}.0\n'
            f'vllm:request_success_total{{{labels},finished_reason="length"}} {length}.0\n'
            f'vllm:request_success_total{{{labels},finished_reason="abort"}} 0.0\n')


class EngineSockets:
    """Addresses for simulated engines, chosen free, so that any number of demos, agents
    and test runs serve their engines side by side: ``claim(ip)`` binds a socket to
    ``(ip, 0)`` - the kernel picks a port no one holds - and keeps it. Until ``serve``
    listens on it, a connection to it is refused, as to a real engine still loading its
    model; ``release`` (or the runner's cleanup, once served) frees it."""

    def __init__(self) -> None:
        self._held: dict[tuple[str, int], socket.socket] = {}

    def claim(self, ip: str) -> int:
        """A free port on ``ip``, held for this engine."""
        sock = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET,
                             socket.SOCK_STREAM)
        try:
            sock.bind((ip, 0))
        except OSError:
            sock.close()
            raise
        port = int(sock.getsockname()[1])
        self._held[(ip, port)] = sock
        return port

    def take(self, ip: str, port: int) -> socket.socket:
        """The claimed socket, for a server of the caller's own (KeyError for an address
        not claimed here); the caller closes it."""
        return self._held.pop((ip, port))

    async def serve(self, ip: str, port: int, render: Callable[[], str]) -> web.AppRunner:
        """``/metrics`` from ``render()`` on the claimed ``ip:port`` (KeyError for an
        address not claimed here)."""
        return await serve_metrics(ip, port, render, self.take(ip, port))

    def release(self, ip: str, port: int) -> None:
        """Free a claimed address that was never served (a pod gone while starting)."""
        sock = self._held.pop((ip, port), None)
        if sock is not None:
            sock.close()

    def close(self) -> None:
        for sock in self._held.values():
            sock.close()
        self._held.clear()


async def serve_metrics(ip: str, port: int, render: Callable[[], str],
                        sock: socket.socket | None = None) -> web.AppRunner:
    """An HTTP server at ``ip:port`` (on ``sock`` when given: bound there already)
    answering ``/metrics`` with ``render()``; the caller cleans the returned runner up."""
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=render(), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    try:
        site = (web.TCPSite(runner, ip, port) if sock is None
                else web.SockSite(runner, sock))
        await site.start()
    except BaseException:
        await runner.cleanup()
        if sock is not None:
            sock.close()
        raise
    return runner


async def start_engines(engines: list[SimulatedEngine], clock: Callable[[], float],
                        sockets: EngineSockets | None = None) -> list[web.AppRunner]:
    """Serve every engine at its pod's IP and annotated port (claimed in ``sockets`` when
    given); clean the runners up after."""
    runners: list[web.AppRunner] = []
    try:
        for e in engines:
            port = int(dict(e.pod.annotations)[PORT_ANNOTATION])

            def render(e: SimulatedEngine = e) -> str:
                return e.render(clock())
            runners.append(await (sockets.serve(e.pod.ip, port, render) if sockets
                                  else serve_metrics(e.pod.ip, port, render)))
    except BaseException:
        await asyncio.gather(*(r.cleanup() for r in runners))
        raise
    return runners


def engines_for(pods: dict[tuple[str, str], PodInfo],
                loads: dict[tuple[str, str], LoadCurve]) -> list[SimulatedEngine]:
    out = []
    for key, info in pods.items():
        engine = dict(info.annotations).get(ANNOTATION)
        if engine and key in loads:
            out.append(SimulatedEngine(info, engine, loads[key]))
    return out
