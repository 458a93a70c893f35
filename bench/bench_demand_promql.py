"""What one demand-source poll and one PromQL query cost on httpx2 (the package's HTTP
client), beside the same request on aiohttp's client as the code sent it before (ef62756),
measured in the same run: the ratio is the figure to compare across machines.

The server is a plain asyncio HTTP/1.1 server in another process on loopback (its CPU is not
counted), answering keep-alive requests by path: ``/metrics`` a gateway's exposition (the
pending-work gauge among ``--families`` other gauges), ``/api/v1/query`` a one-series
vector, ``/api/v1/query_range`` a matrix of ``--series`` series of 61 points (an hour at
``gpuscale idle``'s 60 s step).

After (httpx2): gpuscale's own code on the path - ``DemandSources._poll`` on the client of
``DemandSources.session()`` for a ``metrics`` and a ``prometheus`` source, and
``Prometheus.range`` on ``Prometheus.session()``. Before (aiohttp): a copy of ef62756's
request code in this file - one ``ClientSession(timeout=ClientTimeout(total=...),
trust_env=False)``, ``get(..., allow_redirects=False)``, the status check, the bounded read
over ``resp.content`` - feeding the same parsing gpuscale does (prometheus_client's parser,
``query_result``, the query API checks and ``promql._result``), so the two differ in the
HTTP client only.

Each figure: one request on a client that stays open (the pollers keep theirs; ``idle``
sends five on one), after 50 of warm-up, ``--ops`` in a row; the client process's CPU
(process_time, all threads) and wall time per request; rounds alternate the clients and
the median round is printed. ``setup``: opening and closing one client (``idle`` pays it
once per command, the scaler once per process).

Usage: PYTHONPATH=src:. .venv/bin/python bench/bench_demand_promql.py [--ops 500]
       [--rounds 3] [--series 100] [--families 40]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

_SERVER = textwrap.dedent("""
    import asyncio, json, sys
    bodies = {k.encode(): v.encode() for k, v in json.loads(sys.stdin.read()).items()}
    heads = {k: (b"HTTP/1.1 200 OK\\r\\nContent-Type: %s\\r\\nContent-Length: %d\\r\\n\\r\\n"
                 % (b"text/plain" if k == b"/metrics" else b"application/json", len(v)))
             for k, v in bodies.items()}
    async def serve(reader, writer):
        try:
            while True:
                request = await reader.readuntil(b"\\r\\n\\r\\n")
                path = request.split(b" ", 2)[1].split(b"?", 1)[0]
                writer.write(heads[path] + bodies[path])
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()
    async def main():
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        print(server.sockets[0].getsockname()[1], flush=True)
        await server.serve_forever()
    asyncio.run(main())
""")

METRIC = "gateway_pending_requests"
QUERY = "sum(queue_depth)"
TIMEOUT_S = 1.0  # the demand sources' default
WARM_UP = 50
Get = Callable[[], Awaitable[object]]
Client = Callable[[], AbstractAsyncContextManager[Get]]


def bodies(series: int, families: int) -> dict[str, str]:
    lines = [f"# TYPE {METRIC} gauge", f'{METRIC}{{model="llama"}} 3',
             f'{METRIC}{{model="other"}} 50']
    for i in range(families):
        lines += [f"# HELP gateway_other_{i} another family", f"# TYPE gateway_other_{i} gauge",
                  f'gateway_other_{i}{{route="r{i}",code="200"}} {i}.5']
    vector = {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {}, "value": [1_800_000_000.0, "7"]}]}}
    matrix = {"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"UUID": f"GPU-{i:08x}", "Hostname": f"node-{i // 8}", "gpu": str(i % 8),
                    "pod": f"vllm-{i}", "namespace": "llm"},
         "values": [[1_800_000_000 + 60 * t, f"{(i * t) % 100}"] for t in range(61)]}
        for i in range(series)]}}
    return {"/metrics": "\n".join(lines) + "\n", "/api/v1/query": json.dumps(vector),
            "/api/v1/query_range": json.dumps(matrix)}


# After: gpuscale's code as it is on the path (httpx2).

def httpx2_demand(base: str, kind: str) -> Client:
    from gpuscale.scaler.sources.demand import DemandSources, parse_config

    source = ({"name": "s", "kind": "metrics", "url": f"{base}/metrics", "metric": METRIC,
               "labels": {"model": "llama"}} if kind == "metrics" else
              {"name": "s", "kind": "prometheus", "url": base, "query": QUERY})
    sources = DemandSources(parse_config({"timeout_s": TIMEOUT_S, "demandSources": [source]}))
    s = sources.config.demand_sources[0]

    @asynccontextmanager
    async def client() -> AsyncIterator[Get]:
        async with sources.session() as http:
            async def get() -> object:
                await sources._poll(http, s)
                assert sources.state()["s"] == "ok", sources.state()
                return sources.pending("s")
            yield get
    return client


def httpx2_promql(base: str) -> Client:
    from gpuscale.tools.promql import Prometheus

    prom = Prometheus(base)

    @asynccontextmanager
    async def client() -> AsyncIterator[Get]:
        async with prom.session() as session:
            async def get() -> object:
                return await prom.range(session, "up", 1_800_000_000.0, 1_800_003_600.0, 60.0)
            yield get
    return client


# Before: ef62756's request code on aiohttp's client, the same parsing.

async def _aiohttp_body(resp: Any, limit: int) -> bytes:
    from gpuscale.common.bounded import CHUNK, gather_bounded

    return await gather_bounded(resp.content.iter_chunked(CHUNK), limit, resp.content_length)


def aiohttp_demand(base: str, kind: str) -> Client:
    import urllib.parse

    import aiohttp
    from prometheus_client.parser import text_string_to_metric_families

    from gpuscale.scaler.sources.demand import MAX_BODY, count, query_result

    async def metrics(http: aiohttp.ClientSession) -> float:
        async with http.get(f"{base}/metrics", allow_redirects=False) as resp:
            if resp.status != 200:
                raise ValueError(f"HTTP {resp.status}")
            text = (await _aiohttp_body(resp, MAX_BODY)).decode()
        total, seen = 0.0, False
        for fam in text_string_to_metric_families(text):
            for sample in fam.samples:
                if sample.name == METRIC and sample.labels.get("model") == "llama":
                    total += sample.value
                    seen = True
        assert seen
        return count(total, METRIC)

    async def prometheus(http: aiohttp.ClientSession) -> float:
        url = base + "/api/v1/query?" + urllib.parse.urlencode({"query": QUERY})
        async with http.get(url, allow_redirects=False) as resp:
            body = json.loads(await _aiohttp_body(resp, MAX_BODY))
        return query_result(body)

    poll = metrics if kind == "metrics" else prometheus

    @asynccontextmanager
    async def client() -> AsyncIterator[Get]:
        timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout, trust_env=False) as http:
            async def get() -> object:
                return await poll(http) > 0
            yield get
    return client


def aiohttp_promql(base: str) -> Client:
    import aiohttp

    from gpuscale.tools.promql import MAX_BODY, TIMEOUT_S, _result

    async def query_range(session: aiohttp.ClientSession) -> object:
        params = {"query": "up", "start": "1800000000.000", "end": "1800003600.000",
                  "step": "60"}
        async with asyncio.timeout(TIMEOUT_S), session.get(
                f"{base}/api/v1/query_range", params=params, allow_redirects=False) as resp:
            body = await _aiohttp_body(resp, MAX_BODY)
        data = json.loads(body)
        assert isinstance(data, dict) and data.get("status") == "success"
        assert isinstance(data.get("data"), dict)
        return _result(data["data"], "matrix", "up")

    @asynccontextmanager
    async def client() -> AsyncIterator[Get]:
        async with aiohttp.ClientSession() as session:
            async def get() -> object:
                return await query_range(session)
            yield get
    return client


async def per_request_ms(client: Client, ops: int) -> tuple[float, float]:
    """(CPU, wall) milliseconds per request on one open client."""
    async with client() as get:
        for _ in range(WARM_UP):
            await get()
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(ops):
            await get()
        return ((time.process_time() - cpu) / ops * 1000,
                (time.perf_counter() - wall) / ops * 1000)


async def setup_ms(client: Client, times: int = 20) -> float:
    """CPU milliseconds to open and close one client."""
    async with client():
        pass
    cpu = time.process_time()
    for _ in range(times):
        async with client():
            pass
    return (time.process_time() - cpu) / times * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--series", type=int, default=100)
    parser.add_argument("--families", type=int, default=40)
    args = parser.parse_args()
    served = bodies(args.series, args.families)
    server = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdin is not None and server.stdout is not None
        server.stdin.write(json.dumps(served))
        server.stdin.close()
        base = f"http://127.0.0.1:{int(server.stdout.readline())}"
        cases: dict[str, dict[str, Client]] = {
            "demand poll, metrics": {"httpx2": httpx2_demand(base, "metrics"),
                                     "aiohttp": aiohttp_demand(base, "metrics")},
            "demand poll, prometheus": {"httpx2": httpx2_demand(base, "prometheus"),
                                        "aiohttp": aiohttp_demand(base, "prometheus")},
            "PromQL query_range": {"httpx2": httpx2_promql(base),
                                   "aiohttp": aiohttp_promql(base)}}
        cpu: dict[str, dict[str, list[float]]] = {c: {"httpx2": [], "aiohttp": []}
                                                  for c in cases}
        wall: dict[str, dict[str, list[float]]] = {c: {"httpx2": [], "aiohttp": []}
                                                   for c in cases}
        for _ in range(args.rounds):
            for case, clients in cases.items():
                for name, client in clients.items():
                    c, w = asyncio.run(per_request_ms(client, args.ops))
                    cpu[case][name].append(c)
                    wall[case][name].append(w)
        setup = {name: asyncio.run(setup_ms(client))
                 for name, client in cases["PromQL query_range"].items()}
    finally:
        server.terminate()
        server.wait()

    def summary(case: str) -> dict[str, Any]:
        med = {k: statistics.median(v) for k, v in cpu[case].items()}
        return {**{f"{k}_cpu_ms": round(med[k], 3) for k in med},
                "cpu_ratio_httpx2_to_aiohttp": round(med["httpx2"] / med["aiohttp"], 2),
                **{f"{k}_wall_ms": round(statistics.median(v), 3)
                   for k, v in wall[case].items()},
                "cpu_ms_rounds": {k: [round(x, 3) for x in v] for k, v in cpu[case].items()}}

    print(json.dumps({
        "body_bytes": {k: len(v.encode()) for k, v in served.items()},
        "ops_per_round": args.ops, "rounds": args.rounds,
        "per_request": {case: summary(case) for case in cases},
        "client_setup_cpu_ms": {k: round(v, 2) for k, v in setup.items()},
    }, indent=1))

if __name__ == "__main__":
    main()
