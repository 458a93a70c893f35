"""CPU per GET of httpx2 (the agent's engine scraper) against aiohttp (the scaler's client),
and the memory each costs to import: a comparison for choosing the scraper's client.

Each client GETs a body from a local server in another process over one reused keep-alive
connection, configured as the agent's scraper would use it (httpx2: engines/scrape.py's
session and ``stream`` + ``read_bounded``; aiohttp: one-connection connector, no cookie
jar, no redirects, the same bounded loop over its chunks), under ``asyncio.timeout`` as a
scrape is. The figure is the client process's CPU (all threads) per GET over ``--gets``
sequential GETs after 200 of warm-up; the server's CPU is not counted. Rounds alternate
the clients; the median round is reported. Memory: VmHWM of a fresh interpreter after
importing each client.

Usage: PYTHONPATH=src:. .venv/bin/python bench/bench_http_clients.py [--gets 3000]
       [--rounds 3] [--bytes N]  (default body: src/gpuscale/engines/vllm_body.py's, ~70 KiB)
"""

from __future__ import annotations

import argparse
import asyncio
import http.cookiejar
import json
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Awaitable, Callable

_SERVER = textwrap.dedent("""
    import asyncio, sys
    body = sys.stdin.buffer.read()
    head = (b"HTTP/1.1 200 OK\\r\\nContent-Type: text/plain; version=0.0.4\\r\\n"
            b"Content-Length: %d\\r\\n\\r\\n" % len(body))
    async def serve(reader, writer):
        try:
            while True:
                request = await reader.readuntil(b"\\r\\n\\r\\n")
                if not request:
                    break
                writer.write(head + body)
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

_PROBE = textwrap.dedent("""
    import importlib, sys
    for name in sys.argv[1:]:
        importlib.import_module(name)
    with open("/proc/self/status") as f:
        print(next(int(line.split()[1]) for line in f if line.startswith("VmHWM")))
""")

LIMIT = 1024 * 1024  # engines/scrape.py's MAX_BODY_BYTES
TIMEOUT_S = 5.0


async def _per_get_ms(get: Callable[[], Awaitable[bytes]], gets: int, size: int) -> float:
    for _ in range(200):
        assert len(await get()) == size
    start = time.process_time()
    for _ in range(gets):
        async with asyncio.timeout(TIMEOUT_S):
            await get()
    return (time.process_time() - start) / gets * 1000


async def httpx2_ms(url: str, gets: int, size: int) -> float:
    import httpx2

    from gpuscale.common.bounded import read_bounded
    from gpuscale.engines.scrape import _NO_TLS

    async with httpx2.AsyncClient(
            trust_env=False, follow_redirects=False, verify=_NO_TLS,
            limits=httpx2.Limits(max_connections=1, max_keepalive_connections=1),
            timeout=httpx2.Timeout(TIMEOUT_S),
            cookies=http.cookiejar.CookieJar(
                http.cookiejar.DefaultCookiePolicy(allowed_domains=[])),
            headers={"Accept": "text/plain", "Accept-Encoding": "identity"}) as client:
        async def get() -> bytes:
            async with client.stream("GET", url) as resp:
                assert resp.status_code == 200
                return await read_bounded(resp, LIMIT)
        return await _per_get_ms(get, gets, size)


async def aiohttp_ms(url: str, gets: int, size: int) -> float:
    import aiohttp

    from gpuscale.common.bounded import CHUNK, gather_bounded

    async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=1),
            timeout=aiohttp.ClientTimeout(total=TIMEOUT_S), trust_env=False,
            cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=False,
            headers={"Accept": "text/plain", "Accept-Encoding": "identity"}) as session:
        async def get() -> bytes:
            async with session.get(url, allow_redirects=False) as resp:
                assert resp.status == 200
                return await gather_bounded(resp.content.iter_chunked(CHUNK), LIMIT,
                                            resp.content_length)
        return await _per_get_ms(get, gets, size)


def vm_hwm_kib(*modules: str) -> int:
    out = subprocess.run([sys.executable, "-c", _PROBE, *modules], capture_output=True,
                         text=True, check=True)
    return int(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gets", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bytes", type=int, default=0, help="a body of N bytes instead")
    args = parser.parse_args()
    if args.bytes:
        body = (b"x 1\n" * (args.bytes // 4 + 1))[:args.bytes]
    else:
        from gpuscale.engines.vllm_body import vllm_body
        body = vllm_body().encode()
    server = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE)
    try:
        assert server.stdin is not None and server.stdout is not None
        server.stdin.write(body)
        server.stdin.close()
        url = f"http://127.0.0.1:{int(server.stdout.readline())}/metrics"
        rounds: dict[str, list[float]] = {"httpx2": [], "aiohttp": []}
        for _ in range(args.rounds):
            rounds["httpx2"].append(asyncio.run(httpx2_ms(url, args.gets, len(body))))
            rounds["aiohttp"].append(asyncio.run(aiohttp_ms(url, args.gets, len(body))))
    finally:
        server.terminate()
        server.wait()
    # The agent's import set (bench/bench_agent_memory.py's STEPS).
    agent = ["google.protobuf", "grpc", "prometheus_client", "pynvml", "yaml", "httpx2",
             "gpuscale.agent.app", "gpuscale.cli.agent"]
    memory = {"python": vm_hwm_kib(), "httpx2": vm_hwm_kib("httpx2"),
              "aiohttp": vm_hwm_kib("aiohttp"), "agent": vm_hwm_kib(*agent),
              "agent + aiohttp": vm_hwm_kib(*agent, "aiohttp")}
    print(json.dumps({
        "body_bytes": len(body), "gets_per_round": args.gets,
        "cpu_ms_per_get": {k: {"median": statistics.median(v), "rounds": v}
                           for k, v in rounds.items()},
        "vm_hwm_mib": {k: round(v / 1024, 1) for k, v in memory.items()},
    }, indent=1))


if __name__ == "__main__":
    main()
