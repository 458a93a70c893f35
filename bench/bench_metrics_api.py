"""The custom metrics API (custom.metrics.k8s.io) under the HPA controller's pattern, and
its freshness, for BENCHMARKS.md.

Part 1 - latency. The server (this process) holds a fleet view of 1,000 nodes x 8 pods
(8,000 pods, 1,000 workloads of 8 pods in 10 namespaces) updated at 1 Hz in-process, a pod
roster watching the same 8,000 running pods, and authorizes every request with a
SubjectAccessReview (cached 10 s) against the test API server (tests/peers/kubeapi.py, on
its own event loop in a thread). A client process speaks as the aggregator does: the
front-proxy client certificate and X-Remote-User, over HTTPS keep-alive connections:
  a) the HPA controller's pattern: 1,000 HPAs (a Pods metric each: ``pods/*/
     gpu_utilization?labelSelector=app=wN``) resynced every 15 s by 5 workers (the
     controller's --concurrent-horizontal-pod-autoscaler-syncs default), 3 cycles;
  b) closed loop: 50 connections asking as fast as the server answers (throughput).
Reports client-side p50/p99 (the kube-apiserver's proxy hop is not included) and the
server's own time per request.

Part 2 - freshness. The real agent on the simulated backend at 1 Hz with a load step at a
random phase, its records into the fleet view in-process; from the step to the first
``pods/*/gpu_utilization`` answer over HTTPS that shows it. p50/p99 over the trials. Next to
it, the DCGM exporter -> Prometheus -> prometheus-adapter path as the seed guides configure
it (dcgm-exporter collects every 30 s, Prometheus scrapes it every 15 s, the adapter runs an
instant query per HPA request): COMPUTED from those intervals with uniform phases, not
measured (no DCGM here).

Usage: .venv/bin/python bench/bench_metrics_api.py [--cycles 3] [--seconds 10] [--trials 20]
(the dev environment: it borrows the test peers and certificate helpers).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import ssl
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpuscale.agent.app import Agent, AgentConfig  # noqa: E402
from gpuscale.attribution.sources import ScenarioSources  # noqa: E402
from gpuscale.metrics_api.answers import MetricAnswers  # noqa: E402
from gpuscale.metrics_api.authz import Authorizer  # noqa: E402
from gpuscale.metrics_api.main import configmap_reader  # noqa: E402
from gpuscale.metrics_api.server import MetricsApiServer, TrustSource  # noqa: E402
from gpuscale.scaler.answers import Answers  # noqa: E402
from gpuscale.scaler.sources.roster import AgentRoster, PodRoster  # noqa: E402
from gpuscale.scaler.state.fleet import FleetView  # noqa: E402
from gpuscale.scaler.state.plan_book import PlanBook  # noqa: E402
from gpuscale.stream.records import PodRecord  # noqa: E402
from gpuscale.stream.subscriber import AgentSubscriber  # noqa: E402
from gpuscale.telemetry.scenario import parse_scenario  # noqa: E402
from gpuscale.telemetry.simulated_gpus import SimulatedBackend  # noqa: E402
from tests.peers.kubeapi import KubeApiPeer, api_client, make_pod  # noqa: E402
from tests.support.pki import issue, make_ca, pem  # noqa: E402

NODES, PODS_PER_NODE, WORKLOADS, NAMESPACES = 1000, 8, 1000, 10
V1B2 = "/apis/custom.metrics.k8s.io/v1beta2"


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1e3


def pod_name(node: int, j: int) -> tuple[int, str]:
    w = (node * PODS_PER_NODE + j) % WORKLOADS
    return w, f"w{w}-{node}-{j}"


def fleet_records(node: int, t: float) -> list[PodRecord]:
    out = []
    for j in range(PODS_PER_NODE):
        w, name = pod_name(node, j)
        out.append(PodRecord(f"ns{w % NAMESPACES}", name, f"node-{node}", {"app": f"w{w}"},
                             None, True, {"gpu-utilization": 50.0 + (node % 7)}, t))
    return out


def certificates(d: Path) -> dict[str, str]:
    """Serving and front-proxy certificates in ``d``; the trust ConfigMap's data."""
    cluster_ca, proxy_ca, serving_ca = (make_ca("kubernetes"), make_ca("front-proxy-ca"),
                                        make_ca("gpuscale-metrics-ca"))
    for name, (crt, key) in {"serving": issue(serving_ca, "gpuscale-metrics-api"),
                             "proxy": issue(proxy_ca, "front-proxy-client", client=True)
                             }.items():
        (d / f"{name}.crt").write_bytes(crt)
        (d / f"{name}.key").write_bytes(key)
    (d / "serving-ca.crt").write_bytes(pem(serving_ca[0]))
    return {"client-ca-file": pem(cluster_ca[0]).decode(),
            "requestheader-client-ca-file": pem(proxy_ca[0]).decode(),
            "requestheader-allowed-names": '["front-proxy-client"]',
            "requestheader-username-headers": '["X-Remote-User"]',
            "requestheader-group-headers": '["X-Remote-Group"]'}


class PeerThread:
    """The test API server on its own event loop, so its work does not share ours."""

    def __init__(self, peer: KubeApiPeer) -> None:
        self.peer = peer
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def start(self) -> None:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.peer.start(), self.loop).result(30)


def allow_all(spec: dict[str, Any]) -> tuple[bool, bool, str]:
    return True, False, "RBAC: allowed"


CLIENT = r"""
import asyncio, json, random, ssl, sys, time
import aiohttp
url, d, mode = sys.argv[1], sys.argv[2], sys.argv[3]
cycles, seconds, workloads, namespaces = (int(sys.argv[4]), float(sys.argv[5]),
                                          int(sys.argv[6]), int(sys.argv[7]))
ctx = ssl.create_default_context(cafile=f"{d}/serving-ca.crt")
ctx.load_cert_chain(f"{d}/proxy.crt", f"{d}/proxy.key")
HEAD = {"X-Remote-User": "system:serviceaccount:kube-system:horizontal-pod-autoscaler",
        "X-Remote-Group": "system:serviceaccounts"}
def path(w):
    return (f"{url}/apis/custom.metrics.k8s.io/v1beta2/namespaces/ns{w % namespaces}/pods/*/"
            f"gpu_utilization?labelSelector=app%3Dw{w}")
async def main():
    lat, errors, cycle_s = [], 0, []
    async def get(s, w):
        nonlocal errors
        t0 = time.perf_counter()
        async with s.get(path(w), headers=HEAD) as r:
            body = await r.read()
            if r.status != 200:
                errors += 1
                if errors < 3: print(body[:300], file=sys.stderr)
                return
        lat.append(time.perf_counter() - t0)
    if mode == "hpa":
        conn = aiohttp.TCPConnector(limit=5, ssl=ctx)
        async with aiohttp.ClientSession(connector=conn) as s:
            for c in range(cycles):
                start = time.perf_counter()
                queue = list(range(workloads)); random.shuffle(queue)
                async def worker():
                    while queue:
                        await get(s, queue.pop())
                await asyncio.gather(*(worker() for _ in range(5)))
                cycle_s.append(time.perf_counter() - start)
                if c < cycles - 1:
                    await asyncio.sleep(max(0.0, 15 - (time.perf_counter() - start)))
    else:
        conn = aiohttp.TCPConnector(limit=50, ssl=ctx)
        async with aiohttp.ClientSession(connector=conn) as s:
            end = time.perf_counter() + seconds
            async def caller():
                while time.perf_counter() < end:
                    await get(s, random.randrange(workloads))
            await asyncio.gather(*(caller() for _ in range(50)))
    print(json.dumps({"lat": lat, "errors": errors, "cycles": cycle_s}))
asyncio.run(main())
"""


async def latency(cycles: int, seconds: float) -> None:
    d = Path(tempfile.mkdtemp(prefix="gs-bench-mapi-"))
    peer = KubeApiPeer()
    peer.bookmark_every = None
    peer.set_configmap("kube-system", "extension-apiserver-authentication", certificates(d))
    peer.authorize = allow_all
    for n in range(NODES):
        for j in range(PODS_PER_NODE):
            w, name = pod_name(n, j)
            pod = make_pod(f"ns{w % NAMESPACES}", name, f"uid-{name}", node=f"node-{n}",
                           labels={"app": f"w{w}"})
            pod["spec"]["containers"] = [{"name": "c", "resources": {
                "limits": {"nvidia.com/gpu": "1"}}}]
            peer.pods[f"uid-{name}"] = pod
    thread = PeerThread(peer)
    thread.start()
    fleet = FleetView(stale_after=3.0)
    for n in range(NODES):
        fleet.update_node(f"node-{n}", fleet_records(n, time.monotonic()))
    api = api_client(peer)
    sub = AgentSubscriber(fleet, "bench")
    roster = PodRoster(api, AgentRoster(sub))
    authz = Authorizer(api)
    answers = MetricAnswers(Answers(fleet, roster=roster, plans=PlanBook()), None)
    server = MetricsApiServer(answers, authz,
                              TrustSource(configmap_reader(api)), d / "serving.crt",
                              d / "serving.key", "127.0.0.1", 0)
    handler: list[float] = []
    original = server._answer

    async def timed(request: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return await original(request)
        finally:
            handler.append(time.perf_counter() - t0)

    server._answer = timed  # type: ignore[method-assign]

    async def updates() -> None:  # every node once a second, spread over the second
        while True:
            for n in range(NODES):
                fleet.update_node(f"node-{n}", fleet_records(n, time.monotonic()))
                if n % 50 == 49:
                    await asyncio.sleep(0.05)

    bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    tasks = [asyncio.create_task(t) for t in (roster.run(), updates(),
                                              server.serve(bound.set_result))]
    port = await bound
    while not roster.ready()[0]:
        await asyncio.sleep(0.1)
    url = f"https://127.0.0.1:{port}"
    try:
        for label, mode in ((f"HPA pattern: {WORKLOADS} HPAs every 15 s, 5 workers, "
                             f"{cycles} cycles", "hpa"),
                            ("closed loop, 50 connections", "closed")):
            handler.clear()
            reviews = authz.reviews
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", CLIENT, url, str(d), mode, str(cycles), str(seconds),
                str(WORKLOADS), str(NAMESPACES), stdout=asyncio.subprocess.PIPE,
                env={**os.environ, "PYTHONPATH": str(REPO / "src")})
            out, _ = await proc.communicate()
            res = json.loads(out)
            lat = res["lat"]
            extra = (f"; a cycle of {WORKLOADS} took "
                     + ", ".join(f"{c:.2f}" for c in res["cycles"]) + " s"
                     if res["cycles"] else f"; {len(lat) / seconds:,.0f} requests/s")
            print(f"  {label}: client p50 {pct(lat, 0.5):.2f} ms p99 {pct(lat, 0.99):.2f} ms "
                  f"({len(lat)} requests, errors {res['errors']}){extra}; server p50 "
                  f"{pct(handler, 0.5):.3f} ms p99 {pct(handler, 0.99):.3f} ms; "
                  f"SubjectAccessReviews sent {authz.reviews - reviews}")
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await sub.close()
        await api.close()


async def freshness(trials: int) -> None:
    d = Path(tempfile.mkdtemp(prefix="gs-bench-mapi-"))
    peer = KubeApiPeer()
    data = certificates(d)
    peer.set_configmap("kube-system", "extension-apiserver-authentication", data)
    peer.authorize = allow_all
    thread = PeerThread(peer)
    thread.start()
    api = api_client(peer)
    ctx = ssl.create_default_context(cafile=str(d / "serving-ca.crt"))
    ctx.load_cert_chain(d / "proxy.crt", d / "proxy.key")
    head = {"X-Remote-User": "hpa"}
    import aiohttp

    delays: list[float] = []
    for _ in range(trials):
        step_at = 2.0 + random.random()  # scenario seconds; the phase against ticks varies
        doc = {"nodes": [{"name": "n", "gpus": [{"model": "L4"}], "processes": [
            {"gpu": 0, "memory_mib": 1000, "load": {"steps": [[0, 0], [step_at, 80]]},
             "pod": {"namespace": "ns", "name": "w-0", "container": "c"}}]}]}
        node = parse_scenario(doc).nodes[0]
        fleet = FleetView(stale_after=3.0)
        start = time.time()
        agent = Agent(SimulatedBackend(node, start=start),
                      AgentConfig("127.0.0.1", 0, 1.0, "n"), ScenarioSources(node))
        agent.add_sink(fleet)
        server = MetricsApiServer(MetricAnswers(Answers(fleet, plans=PlanBook()), None),
                                  Authorizer(api), TrustSource(configmap_reader(api)),
                                  d / "serving.crt", d / "serving.key", "127.0.0.1", 0)
        bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        tasks = [asyncio.create_task(agent.run()),
                 asyncio.create_task(server.serve(bound.set_result))]
        port = await bound
        url = f"https://127.0.0.1:{port}{V1B2}/namespaces/ns/pods/*/gpu_utilization" \
              "?labelSelector=app%3Dw"
        changed = None
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as s:
            while changed is None:
                async with s.get(url, headers=head) as r:
                    body = await r.json(content_type=None)
                if r.status == 200 and body["items"] and body["items"][0]["value"] != "0":
                    changed = time.time()
                await asyncio.sleep(0.005)
        delays.append(changed - (start + step_at))
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    await api.close()
    print(f"  gpuscale: load step -> changed in the metrics API: p50 "
          f"{pct(delays, 0.5):.0f} ms, p99 {pct(delays, 0.99):.0f} ms ({trials} trials)")
    rng = random.Random(1)
    dcgm = [rng.uniform(0, 30) + rng.uniform(0, 15) for _ in range(100_000)]
    print(f"  DCGM exporter (collect 30 s) -> Prometheus (scrape 15 s) -> adapter (instant "
          f"query), COMPUTED: p50 {pct(dcgm, 0.5) / 1e3:.1f} s, p99 "
          f"{pct(dcgm, 0.99) / 1e3:.1f} s, at most 45 s")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--trials", type=int, default=20)
    args = parser.parse_args()
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}")
    from bench.grpc_floor import yardstick

    print(yardstick())
    print(f"1. custom.metrics.k8s.io, {WORKLOADS} workloads, {NODES * PODS_PER_NODE} pods "
          "updated at 1 Hz, the aggregator's front-proxy certificate, reviews cached 10 s:")
    await latency(args.cycles, args.seconds)
    print("2. freshness, agent sampling at 1 Hz:")
    await freshness(args.trials)


if __name__ == "__main__":
    asyncio.run(main())
