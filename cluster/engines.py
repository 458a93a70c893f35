"""Simulated inference engines on the pods' IPs, and the load they carry.

The load is what a gateway in front of the workload would hold: ``load.json`` in the
cluster's directory maps ``<namespace>/<app label>`` to requests in flight (a test or a
person writes it; ``./dev cluster load llm/vllm-chat 40``). Only Ready pods get a share,
as behind a Service. A replica runs up to its batch (``gpuscale.io/sim-batch``, default
16) and queues the rest; an engine listens once its pod is Ready (a real engine answers
only after loading its model), in vLLM's /metrics format."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from gpuscale.engines.simulated_engines import serve_metrics, vllm_metrics

BATCH_ANNOTATION = "gpuscale.io/sim-batch"
DEFAULT_BATCH = 16
MAX_IN_FLIGHT = 1_000_000
MAX_LOAD_FILE = 1 << 20  # bytes: a larger load.json is refused whole


def read_load(path: Path) -> dict[str, int]:
    """``load.json``; a missing, malformed or oversized file is no load, never a crash of
    the runner; values are clamped to 0..MAX_IN_FLIGHT."""
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_LOAD_FILE + 1)
        data = json.loads(raw) if len(raw) <= MAX_LOAD_FILE else None
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k)[:253]: max(0, min(MAX_IN_FLIGHT, int(v))) for k, v in data.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)}


def workload_key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace')}/{(meta.get('labels') or {}).get('app', '')}"


@dataclass
class EngineState:
    running: int = 0
    waiting: int = 0
    batch: int = DEFAULT_BATCH

    def render(self) -> str:
        kv = min(0.95, 0.15 + 0.8 * self.running / max(1, self.batch))
        return vllm_metrics("sim-llm", self.running, self.waiting, kv)


def shares(demand: int, ready: list[str]) -> dict[str, int]:
    """``demand`` requests spread over the Ready pods as evenly as whole requests go."""
    if not ready:
        return {}
    base, extra = divmod(demand, len(ready))
    return {uid: base + (1 if i < extra else 0) for i, uid in enumerate(sorted(ready))}


GATEWAY_PORT = 9090
GATEWAY_METRIC = "gateway_pending_requests"


class Gateway:
    """The gateway in front of every workload: it holds a workload's requests while none
    of its pods is Ready (what wakes a workload from zero), and serves the count in the
    Prometheus format a demand source reads (``gateway_pending_requests{workload=...}``)."""

    def __init__(self) -> None:
        self.pending: dict[str, int] = {}
        self.runner: web.AppRunner | None = None

    async def start(self, ip: str, port: int = GATEWAY_PORT) -> None:
        self.runner = await serve_metrics(ip, port, self.render)

    def render(self) -> str:
        lines = [f"# TYPE {GATEWAY_METRIC} gauge"]
        for key, n in sorted(self.pending.items()):
            lines.append(f'{GATEWAY_METRIC}{{workload="{key}"}} {n}')
        return "\n".join(lines) + "\n"

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


class Engines:
    def __init__(self) -> None:
        self.state: dict[str, EngineState] = {}
        self.runners: dict[str, web.AppRunner] = {}

    async def start(self, uid: str, ip: str, port: int, batch: int) -> None:
        st = self.state.setdefault(uid, EngineState(batch=batch))
        self.runners[uid] = await serve_metrics(ip, port, st.render)

    async def stop(self, uid: str) -> None:
        runner = self.runners.pop(uid, None)
        self.state.pop(uid, None)
        if runner is not None:
            await runner.cleanup()

    def set_load(self, uid: str, in_flight: int) -> None:
        st = self.state.get(uid)
        if st is not None:
            st.running = min(in_flight, st.batch)
            st.waiting = in_flight - st.running

    async def close(self) -> None:
        for uid in list(self.runners):
            await self.stop(uid)
