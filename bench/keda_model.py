"""The KEDA model of bench_keda.py, as a process of its own: KEDA's operator and the HPA
controller behind it, on one channel, making their calls as KEDA's code makes them (what it
does, with references into kedacore/keda, is in bench_keda.py's docstring).

Run by bench_keda.py (``keda_argv``): ``python bench/keda_model.py TARGET N SECONDS
WARMUP PUSH CONTROLS`` prints "window" and "end" around the measured window, then one JSON
line of figures. bench/keda_go is the same model in Go (same arguments, pattern and JSON).
"""

from __future__ import annotations

import asyncio
import heapq
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import grpc  # noqa: E402

from bench.bench_fleet import flip  # noqa: E402
from bench.bench_scaler import pct  # noqa: E402
from gpuscale.proto import externalscaler_pb2 as pb  # noqa: E402
from gpuscale.proto import externalscaler_pb2_grpc as pb_grpc  # noqa: E402

AGENTS, PODS, WORKLOADS = 1000, 8, 1000
POLL_S, HPA_S, HPA_WORKERS, HPA_DEADLINE_S = 30.0, 15.0, 5, 3.0
SERVICE_CONFIG = json.dumps({"loadBalancingConfig": [{"round_robin": {}}]})
METHODS = ("GetMetricSpec", "GetMetrics", "IsActive")


def ref(i: int) -> pb.ScaledObjectRef:
    w = i % WORKLOADS
    return pb.ScaledObjectRef(name=f"so-{i}", namespace=f"ns{w % 10}",
                              scalerMetadata={"podSelector": f"app=w{w}"})


class Keda:
    """KEDA's operator and the HPA controller behind it, on one channel."""

    def __init__(self, target: str, n: int, push: bool) -> None:
        self.channel = grpc.aio.insecure_channel(target, options=[
            ("grpc.service_config", SERVICE_CONFIG),
            ("grpc.max_receive_message_length", 4 * 1024 * 1024)])
        self.stub = pb_grpc.ExternalScalerStub(self.channel)
        self.n, self.push = n, push
        self.refs = [ref(i) for i in range(n)]
        self.spec_cached = [False] * n
        self.measuring = False
        self.stopping = False
        self.lat: dict[str, list[float]] = {m: [] for m in METHODS}
        self.chains: dict[str, list[float]] = {"hpa": [], "poll": []}
        self.hpa_late: list[float] = []
        self.errors: Counter[str] = Counter()
        self.chain_failures: Counter[str] = Counter()
        self.streams_first: Counter[str] = Counter()  # streams that delivered, by kind
        self.stream_errors: Counter[str] = Counter()
        self.pushes = 0
        self.first_push_s: list[float] = []
        self.unseen: list[str] = []  # freshness probes whose change never showed in 10 s
        self.client_lag: list[float] = []  # this client's own event-loop lateness (ms)

    def stopped(self) -> bool:
        return self.stopping

    async def _call(self, method: str, req: Any, timeout: float | None) -> Any:
        t0 = time.perf_counter()
        try:
            got = await getattr(self.stub, method)(req, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            if self.measuring:
                self.errors[f"{method} {exc.code().name}"] += 1
            raise
        if self.measuring:
            self.lat[method].append(time.perf_counter() - t0)
        return got

    async def _trigger(self, i: int, deadline: float | None) -> None:
        """GetMetricSpec (unless streamed), GetMetrics, IsActive: one trigger's calls."""
        def left() -> float | None:
            return None if deadline is None else max(0.001, deadline - time.monotonic())

        r = self.refs[i]
        name = "gpuscale-gpu-utilization"
        if not self.spec_cached[i]:
            spec = await self._call("GetMetricSpec", r, left())
            name = spec.metricSpecs[0].metricName
        await self._call("GetMetrics", pb.GetMetricsRequest(scaledObjectRef=r,
                                                            metricName=name), left())
        await self._call("IsActive", r, left())

    async def chain(self, kind: str, i: int, deadline_s: float | None) -> None:
        """One poll or HPA sync: the trigger's calls, once more after an error (KEDA
        rebuilds the trigger's scaler and retries)."""
        t0 = time.perf_counter()
        deadline = None if deadline_s is None else time.monotonic() + deadline_s
        try:
            try:
                await self._trigger(i, deadline)
            except grpc.aio.AioRpcError:
                await self._trigger(i, deadline)
        except grpc.aio.AioRpcError as exc:
            if self.measuring:
                self.chain_failures[f"{kind} {exc.code().name}"] += 1
            return
        if self.measuring:
            self.chains[kind].append(time.perf_counter() - t0)

    async def poller(self, i: int, start: float) -> None:
        due = start + random.uniform(0, POLL_S)  # the phase its reconcile gave it
        while not self.stopping:
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            due += POLL_S  # start to start: a slow check does not shift the phase
            await self.chain("poll", i, None)

    async def hpa(self, start: float) -> None:
        """The HPA controller: every HPA every 15 s, 5 workers taking what is due."""
        queue: asyncio.Queue[tuple[float, int]] = asyncio.Queue()

        async def worker() -> None:
            while True:
                due, i = await queue.get()
                if self.measuring:
                    self.hpa_late.append(time.monotonic() - due)
                await self.chain("hpa", i, HPA_DEADLINE_S)

        workers = [asyncio.create_task(worker()) for _ in range(HPA_WORKERS)]
        heap = [(start + random.uniform(0, HPA_S), i) for i in range(self.n)]
        heapq.heapify(heap)
        try:
            while not self.stopping:
                due, i = heap[0]
                if due > time.monotonic():
                    await asyncio.sleep(due - time.monotonic())
                heapq.heapreplace(heap, (due + HPA_S, i))
                queue.put_nowait((due, i))
        finally:
            for w in workers:
                w.cancel()

    async def stream(self, i: int, kind: str, opened: float) -> None:
        backoff = 2.0
        while not self.stopping:
            call = getattr(self.stub, kind)(self.refs[i])
            first = True
            try:
                async for _ in call:
                    if first:
                        self.streams_first[kind] += 1
                        self.first_push_s.append(time.monotonic() - opened)
                        first = False
                        if kind == "StreamMetricSpec":  # KEDA resets its backoff once
                            self.spec_cached[i] = True  # this stream delivered (L310-315)
                            backoff = 2.0
                    self.pushes += 1
                backoff = 2.0  # an orderly end (EOF) resets it for both (L252-257)
            except grpc.aio.AioRpcError as exc:
                if self.stopped():
                    return
                self.stream_errors[f"{kind} {exc.code().name}"] += 1
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 60.0)
            opened = time.monotonic()

    async def own_lag(self) -> None:
        """How late this client's own event loop runs a 1 ms timer: a call's latency here
        includes it, and the scaler is not the cause of it (the client shares its core
        with the agents' generators)."""
        while not self.stopping:
            t0 = time.perf_counter()
            await asyncio.sleep(0.001)
            if self.measuring:
                self.client_lag.append(time.perf_counter() - t0 - 0.001)

    async def freshness(self, controls: list[list[int]], probes: list[float]) -> None:
        """Flip a node's load; GetMetrics on the same channel until the value moved."""
        while controls and not self.stopping:
            await asyncio.sleep(2.0 + random.random())
            node = random.randrange(controls[-1][1])
            port = next(c[2] for c in controls if c[0] <= node < c[1])
            w = (node * PODS) % WORKLOADS
            req = pb.GetMetricsRequest(scaledObjectRef=ref(w),
                                       metricName="gpuscale-gpu-utilization")

            async def value(req: pb.GetMetricsRequest = req) -> float:
                got = await self.stub.GetMetrics(req, timeout=10)
                return float(got.metricValues[0].metricValueFloat)

            try:
                before = await value()
                t0 = time.monotonic()  # before the flip: a change published before its
                boost = await flip(port, node)  # reply counts (errs long, not short)
                last = await value()
                while abs(last - before) < 150 and time.monotonic() - t0 < 10:
                    await asyncio.sleep(0.02)
                    last = await value()
                if self.measuring:
                    probes.append(time.monotonic() - t0)
                    if time.monotonic() - t0 >= 10:
                        self.unseen.append(f"node {node} (+{boost:g}): {before:.0f} -> "
                                           f"{last:.0f}")
            except (grpc.aio.AioRpcError, OSError, ValueError, TimeoutError):
                continue  # (a generator that did not answer: the next probe)

    async def run(self, seconds: float, warmup: float, controls: list[list[int]],
                  ) -> dict[str, Any]:
        await self.channel.channel_ready()
        start = time.monotonic()
        tasks = []
        if self.push:
            tasks += [asyncio.create_task(self.stream(i, kind, start))
                      for i in range(self.n) for kind in ("StreamIsActive",
                                                          "StreamMetricSpec")]
        tasks += [asyncio.create_task(self.poller(i, start)) for i in range(self.n)]
        tasks.append(asyncio.create_task(self.hpa(start)))
        tasks.append(asyncio.create_task(self.own_lag()))
        probes: list[float] = []
        tasks.append(asyncio.create_task(self.freshness(controls, probes)))
        await asyncio.sleep(warmup)
        streams_at_warmup = dict(self.streams_first)
        self.measuring = True
        print("window", flush=True)
        cpu0, t0 = time.process_time(), time.monotonic()
        await asyncio.sleep(seconds)
        self.measuring = False
        wall = time.monotonic() - t0
        cpu = time.process_time() - cpu0
        print("end", flush=True)
        self.stopping = True
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.channel.close()
        every = [x for m in METHODS for x in self.lat[m]]
        return {
            "objects": self.n, "push": self.push, "seconds": wall,
            "calls": len(every), "calls_per_s": len(every) / wall,
            "call_p50_ms": pct(every, 0.5), "call_p99_ms": pct(every, 0.99),
            "per_method": {m: {"n": len(v), "p50_ms": pct(v, 0.5), "p99_ms": pct(v, 0.99)}
                           for m, v in self.lat.items()},
            "chains": {k: {"n": len(v), "p50_ms": pct(v, 0.5), "p99_ms": pct(v, 0.99)}
                       for k, v in self.chains.items()},
            "hpa_late_p99_ms": pct(self.hpa_late, 0.99),
            "errors": dict(self.errors), "chain_failures": dict(self.chain_failures),
            "streams_delivered_by_warmup": streams_at_warmup,
            "streams_delivered": dict(self.streams_first),
            "stream_errors": dict(self.stream_errors), "pushes": self.pushes,
            "first_push_p99_s": pct(self.first_push_s, 0.99) / 1e3,
            "freshness_ms": sorted(p * 1e3 for p in probes), "unseen": self.unseen,
            "client_cpu": cpu / wall,
            "client_lag_p50_p99_max_ms": (pct(self.client_lag, 0.5),
                                          pct(self.client_lag, 0.99),
                                          max(self.client_lag, default=0.0) * 1e3),
        }


async def keda_main(target: str, n: int, seconds: float, warmup: float, push: bool,
                    controls: list[list[int]]) -> None:
    got = await Keda(target, n, push).run(seconds, warmup, controls)
    print(json.dumps(got), flush=True)


def keda_argv(target: str, n: int, seconds: float, warmup: float, push: bool,
              controls: list[list[int]], client_cpus: str, go: Path | None) -> list[str]:
    """The KEDA model as a process of its own (on ``client_cpus`` when given): this
    file's, or with ``go`` the grpc-go one built from bench/keda_go (same arguments,
    same pattern, same JSON)."""
    model = [str(go)] if go else [sys.executable, __file__]
    argv = [*model, target, str(n), str(seconds), str(warmup), "1" if push else "0",
            json.dumps(controls)]
    return ["taskset", "-c", client_cpus, *argv] if client_cpus else argv


if __name__ == "__main__":
    target, n, seconds, warmup, push, ctl = sys.argv[1:7]
    asyncio.run(keda_main(target, int(n), float(seconds), float(warmup), push == "1",
                          json.loads(ctl)))
