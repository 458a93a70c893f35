"""A bench that is KEDA: its operator's calls, as its code makes them, against the real
scaler fed by 1,000 agents (8 pods each, 1 Hz), at 1,000 and 10,000 ScaledObjects.

What KEDA does, read in kedacore/keda at 8b4f083ca8c8c2baf8477e322bd4d16ac4dfa09a:
- ONE connection per scalerAddress, shared by every ScaledObject (pkg/scalers/
  external_scaler.go L64-71, L393-431), dialled with grpc.NewClient (DNS resolver) and the
  service config {"loadBalancingConfig": [{"round_robin":{}}]} (L62): a headless Service's
  addresses get calls in turn. Here: one channel, the same service config; with
  ``--replicas`` > 1 its target lists every replica (``ipv4:`` = a headless Service's A
  records). No keepalive, no deadline in its service config.
- The poll loop per ScaledObject every pollingInterval (30 s default, apis/keda/v1alpha1/
  withtriggers_types.go L51), start to start, no jitter: the phase its reconcile gave it
  (pkg/scaling/scale_handler.go L268-302); per trigger GetMetricSpec (unless a streamed spec
  is cached, pkg/scaling/cache/scalers_cache.go L218-220), then GetMetrics, then IsActive
  (external_scaler.go L210, L225; scale_handler.go L1034, L1060); no deadline at all.
- The HPA path: the HPA controller syncs each HPA every 15 s with 5 workers
  (kube-controller-manager's defaults); each sync reaches the operator through KEDA's
  metrics adapter (pkg/provider/provider.go L75-111), which calls GetMetricSpec for every
  trigger (unless streamed), then GetMetrics and IsActive (scale_handler.go L677-869).
  The adapter's service config names a 3 s timeout (pkg/metricsservice/client.go L51-61);
  grpc-go may skip it (its methodConfig has no "name"), and here the chain gets 3 s.
- An error: the trigger's scaler is rebuilt and the same calls made once more
  (scalers_cache.go L224-236, L261-272), so errors double calls.
- external-push (``--push``): one StreamIsActive and one StreamMetricSpec per trigger on
  the same connection (external_scaler.go L234-240), all opened at once (as after an
  operator restart), re-opened after 2 s doubling to 60 s (L243, L264-266, L286, L296-298);
  once StreamMetricSpec has delivered, GetMetricSpec is no longer called.

So one scaler sees ~0.3 calls/s per ScaledObject: 300/s at 1,000 and 3,000/s at 10,000.
ScaledObjects are so-0..N-1 over 1,000 workloads (10 per workload at 10,000), each with
podSelector app=wK in namespace nsK%10. Freshness: a node's load is flipped (through the
agent generator) and the same channel asks GetMetrics every 20 ms until the value moved.
The scaler is the real ``gpuscale scaler`` (CPU and RSS from /proc); the generators are
bench_fleet.py's (the real TelemetryPublisher, one gRPC server per agent). The yardstick
(grpc.aio's empty-handler CPU per call, bench/grpc_floor.py) is measured in the same run.

The KEDA model is this file's (Python, grpc.aio) or, with ``--client go``, bench/keda_go's:
the same pattern, arguments and JSON in Go with grpc-go, KEDA's own language and library
(older releases than KEDA's: Go 1.19 and grpc-go 1.33 from Debian, which the bench installs
with apt-get - as root or through sudo - when missing, and builds into build/keda_go). The
Go model costs about half the client CPU per call (BENCHMARKS.md) and reads the floor's
HPA chain 0.3-1 ms lower at p99 at 1,000 ScaledObjects.

Usage: .venv/bin/python bench/bench_keda.py [--objects 1000 10000] [--seconds 60]
       [--push] [--replicas 1] [--pin] [--lag-probe] [--floor] [--client python|go]
       [--agent-phases independent|grouped] [--answer-process] [--scaler-cores 2]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import heapq
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import grpc  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from bench import grpc_floor  # noqa: E402
from bench.bench_fleet import flip, free_port, histogram_quantiles  # noqa: E402
from bench.bench_scaler import pct  # noqa: E402
from bench.proc import child_env, children, proc_cpu_seconds, proc_mem_mib  # noqa: E402
from gpuscale.proto import externalscaler_pb2 as pb  # noqa: E402
from gpuscale.proto import externalscaler_pb2_grpc as pb_grpc  # noqa: E402

AGENTS, PODS, WORKLOADS = 1000, 8, 1000
GO_SOURCE, GO_BUILD = REPO / "bench" / "keda_go", REPO / "build" / "keda_go"
GO_PATH = Path("/usr/share/gocode")  # where Debian's Go library packages put their source
# (protobuf 1.5's APIv1 shim, not 1.3's, which grpc-go's package would pull in: grpc-go's
# codec decodes through it, and 1.3 cannot read messages protoc-gen-go's APIv2 makes)
GO_PACKAGES = ("golang-go", "golang-google-grpc-dev", "golang-google-protobuf-dev",
               "golang-github-golang-protobuf-1-5-dev", "protobuf-compiler", "protoc-gen-go",
               "protoc-gen-go-grpc")
POLL_S, HPA_S, HPA_WORKERS, HPA_DEADLINE_S = 30.0, 15.0, 5, 3.0
SERVICE_CONFIG = json.dumps({"loadBalancingConfig": [{"round_robin": {}}]})
METHODS = ("GetMetricSpec", "GetMetrics", "IsActive")


def ref(i: int) -> pb.ScaledObjectRef:
    w = i % WORKLOADS
    return pb.ScaledObjectRef(name=f"so-{i}", namespace=f"ns{w % 10}",
                              scalerMetadata={"podSelector": f"app=w{w}"})


# -- KEDA (the client process) ------------------------------------------------------------


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


# -- KEDA in Go ---------------------------------------------------------------------------


def go_version() -> str:
    """The Go toolchain and grpc-go the Go model is built with."""
    go = subprocess.run(["go", "version"], capture_output=True, text=True, check=True)
    grpc_go = (GO_PATH / "src/google.golang.org/grpc/version.go").read_text()
    return (f"{go.stdout.split()[2]}, grpc-go "
            f"{grpc_go.split('Version = ')[1].split()[0].strip(chr(34))}")


def build_go_client() -> Path:
    """bench/keda_go built against Debian's Go toolchain and grpc-go (packages installed
    with apt-get when missing, as ./dev installs the tests' Prometheus), the stubs made from
    the project's copy of KEDA's proto. GOPATH mode: Debian's packages are the libraries;
    nothing is fetched. Rebuilt when the source, the proto or the toolchain changed."""
    install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *GO_PACKAGES]
    try:
        have = subprocess.run(["dpkg-query", "-W", "-f", "${Status}\\n", *GO_PACKAGES],
                              capture_output=True, text=True, check=False).stdout.splitlines()
        if len(have) != len(GO_PACKAGES) or any(not h.endswith(" installed") for h in have):
            sudo = [] if os.geteuid() == 0 else ["sudo"]
            print(f"installing Debian packages for the Go KEDA model: {' '.join(GO_PACKAGES)}",
                  flush=True)
            # (an index that cannot be refreshed may still hold the packages: go on)
            subprocess.run([*sudo, "apt-get", "update", "-qq"], check=False)
            subprocess.run([*sudo, "env", "DEBIAN_FRONTEND=noninteractive", *install],
                           check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise SystemExit(f"--client go needs Debian's Go and grpc-go packages (bookworm or "
                         f"newer), installed as root: {' '.join(install)} ({exc})") from exc
    proto = REPO / "src" / "gpuscale" / "proto" / "externalscaler.proto"
    digest = hashlib.sha256((GO_SOURCE / "main.go").read_bytes() + proto.read_bytes()
                            + go_version().encode()).hexdigest()
    binary, stamp = GO_BUILD / "keda_go", GO_BUILD / "stamp"
    if binary.exists() and stamp.exists() and stamp.read_text() == digest:
        return binary
    src = GO_BUILD / "src" / "kedamodel"
    shutil.rmtree(GO_BUILD, ignore_errors=True)
    (src / "externalscaler").mkdir(parents=True)
    shutil.copy(GO_SOURCE / "main.go", src / "main.go")
    where = "Mexternalscaler.proto=kedamodel/externalscaler"
    subprocess.run(["protoc", f"-I{proto.parent}",
                    f"--go_out={src / 'externalscaler'}", "--go_opt=paths=source_relative",
                    f"--go_opt={where}", f"--go-grpc_out={src / 'externalscaler'}",
                    "--go-grpc_opt=paths=source_relative", f"--go-grpc_opt={where}",
                    proto.name], check=True)
    subprocess.run(["go", "build", "-o", str(binary), "."], cwd=src, check=True, env={
        **os.environ, "GOPATH": f"{GO_BUILD}:{GO_PATH}", "GO111MODULE": "off",
        "GOCACHE": str(GO_BUILD / "cache"), "GOFLAGS": ""})
    stamp.write_text(digest)
    return binary


# -- the orchestra --------------------------------------------------------------------------


def metrics_text(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return str(r.read().decode())


def start_fleet(generators: int, env: dict[str, str], cpus: str,
                ) -> tuple[list[subprocess.Popen[str]],
                                                              list[list[int]], list[str]]:
    per = AGENTS // generators
    gens, controls, addrs = [], [], []
    for k in range(generators):
        first, port_base, control = k * per, 21000 + k * per, free_port()
        argv = [sys.executable, str(REPO / "bench" / "bench_fleet.py"), "--generate",
                str(first), str(per), str(port_base), str(control)]
        if cpus:
            argv = ["taskset", "-c", cpus, *argv]
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, env=env, text=True)
        gens.append(p)
        controls.append([first, first + per, control])
        addrs += [f"127.0.0.1:{port_base + i}" for i in range(per)]
    for p in gens:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return gens, controls, addrs


def start_scalers(replicas: int, addrs: list[str], env: dict[str, str], pin: int,
                  stream_mib: int, answer_process: bool = False,
                  ) -> list[tuple[subprocess.Popen[str], int, int]]:
    out = []
    for r in range(replicas):
        port, mport = free_port(), free_port()
        argv = [sys.executable, "-m", "gpuscale.cli", "--log-level", "WARNING", "scaler",
                "--host", "127.0.0.1", "--port", str(port), "--metrics-port", str(mport),
                "--agents", ",".join(addrs), "--agents-insecure",
                "--stream-memory-mib", str(stream_mib),
                *(["--answer-process"] if answer_process else [])]
        if pin:  # replica r on its own `pin` cores (its answer process with it)
            argv = ["taskset", "-c", f"{r * pin}-{r * pin + pin - 1}", *argv]
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, env=env, text=True)
        assert p.stdout is not None and "gpuscale scaler" in p.stdout.readline()
        out.append((p, port, mport))
    deadline = time.monotonic() + 180
    for _, _, mport in out:
        while f"gpuscale_scaler_fleet_pods {float(AGENTS * PODS)}" not in metrics_text(mport):
            if time.monotonic() > deadline:
                raise RuntimeError("the scaler did not see the whole fleet in 180 s")
            time.sleep(1)
    return out


def samples(text: str, family: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample name, labels) -> value of one family in a /metrics text (prometheus_client's
    own parser)."""
    return {(smp.name, tuple(sorted(smp.labels.items()))): smp.value
            for fam in text_string_to_metric_families(text) if fam.name == family
            for smp in fam.samples}


def gc_pauses(before: str, after: str) -> dict[str, tuple[int, float, float]]:
    """Generation -> (collections, seconds in all, the largest pause's bucket bound) between
    two scrapes of the scaler's gpuscale_scaler_gc_pause_seconds."""
    family = "gpuscale_scaler_gc_pause_seconds"
    b, a = samples(before, family), samples(after, family)
    got = {}
    for gen in "012":
        def delta(name: str, gen: str = gen, **labels: str) -> float:
            key = (f"{family}_{name}", tuple(sorted({"generation": gen, **labels}.items())))
            return a.get(key, 0.0) - b.get(key, 0.0)
        count = delta("count")
        bounds = sorted({dict(k[1])["le"] for k in a if k[0].endswith("_bucket")},
                        key=float)
        top = next((float(le) for le in bounds if delta("bucket", le=le) >= count), 0.0)
        got[gen] = (int(count), delta("sum"), top if count else 0.0)
    return got


def answered(text: str) -> float:
    """Calls the scaler counted (gpuscale_scaler_requests_total, every method and code)."""
    return sum(v for (name, _), v in samples(text, "gpuscale_scaler_requests").items()
               if name.endswith("_total"))


def lag_counts(path: Path | None) -> dict[str, tuple[int, float]]:
    """The lag probe's file now: what ran -> (slow callbacks, ms in all), since start."""
    if path is None or not path.exists():
        return {}
    got = {}
    for line in path.read_text().splitlines():
        count, total, _worst, key = line.split("\t", 3)
        got[key] = (int(count), float(total))
    return got


def run_keda(target: str, n: int, seconds: float, warmup: float, push: bool,
             controls: list[list[int]], scalers: list[Any], gens: list[Any],
             env: dict[str, str], client_cpus: str, go: Path | None,
             lag_file: Path | None = None) -> dict[str, Any]:
    p = subprocess.Popen(keda_argv(target, n, seconds, warmup, push, controls, client_cpus,
                                   go),
                         stdout=subprocess.PIPE, env=env, text=True)
    assert p.stdout is not None
    assert p.stdout.readline().strip() == "window"
    pids = [s[0].pid for s in scalers]
    fronts = [children(pid) for pid in pids]  # --answer-process: each scaler's gRPC front
    f0 = [sum(proc_cpu_seconds(f) for f in fs) for fs in fronts]
    c0, t0 = [proc_cpu_seconds(pid) for pid in pids], time.monotonic()
    g0 = sum(proc_cpu_seconds(g.pid) for g in gens)
    scrapes0 = [metrics_text(s[2]) for s in scalers]
    lag0 = lag_counts(lag_file)
    assert p.stdout.readline().strip() == "end"
    wall = time.monotonic() - t0
    if lag_file is not None:
        time.sleep(1.2)  # the probe writes every second
    scrapes1 = [metrics_text(s[2]) for s in scalers]
    got_gc = gc_pauses(scrapes0[0], scrapes1[0])
    delay = histogram_quantiles(scrapes1[0], "gpuscale_scaler_update_delay_seconds",
                                scrapes0[0])
    shares = [answered(b) - answered(a) for a, b in zip(scrapes0, scrapes1, strict=True)]
    gens_cpu = (sum(proc_cpu_seconds(g.pid) for g in gens) - g0) / wall
    front_cpu = [(sum(proc_cpu_seconds(f) for f in fs) - c) / wall
                 for fs, c in zip(fronts, f0, strict=True)]
    cpu = [(proc_cpu_seconds(pid) - c) / wall + fc
           for pid, c, fc in zip(pids, c0, front_cpu, strict=True)]
    front_rss = [sum(proc_mem_mib(f)[0] for f in fs) for fs in fronts]
    rss = [proc_mem_mib(pid)[0] + fr for pid, fr in zip(pids, front_rss, strict=True)]
    got: dict[str, Any] = json.loads(p.stdout.readline())
    p.wait(60)
    got["scaler_cpu"], got["scaler_rss_mib"] = cpu, rss
    got["front_cpu"], got["front_rss_mib"] = front_cpu, front_rss
    got["gc"], got["generators_cpu"], got["answered_by_replica"] = got_gc, gens_cpu, shares
    got["update_delay_p50_p99_s"] = delay[:2]
    window = []  # (what ran, slow callbacks, ms in all) between the two reads
    for key, (count, total) in lag_counts(lag_file).items():
        count0, total0 = lag0.get(key, (0, 0.0))
        if count > count0:
            window.append((key, count - count0, total - total0))
    got["lag_window"] = sorted(window, key=lambda row: -row[1])
    return got


def keda_argv(target: str, n: int, seconds: float, warmup: float, push: bool,
              controls: list[list[int]], client_cpus: str, go: Path | None) -> list[str]:
    """The KEDA model as a process of its own (on ``client_cpus`` when given): this
    file's, or with ``go`` the grpc-go one built from bench/keda_go (same arguments,
    same pattern, same JSON)."""
    model = [str(go)] if go else [sys.executable, __file__, "--keda"]
    argv = [*model, target, str(n), str(seconds), str(warmup), "1" if push else "0",
            json.dumps(controls)]
    return ["taskset", "-c", client_cpus, *argv] if client_cpus else argv


def run_floor(n: int, seconds: float, warmup: float, push: bool, env: dict[str, str],
              server_cpus: str, client_cpus: str, go: Path | None) -> dict[str, Any]:
    """The same KEDA client against grpc_floor's keda-empty server (prebuilt answers,
    nothing behind them) on the scaler's core: what the client and the transport cost."""
    port = free_port()
    argv = [sys.executable, str(REPO / "bench" / "grpc_floor.py"), "--serve", "keda-empty",
            str(port), *([server_cpus] if server_cpus else [])]
    stub = subprocess.Popen(argv, stdout=subprocess.PIPE, env=env, text=True)
    try:
        assert stub.stdout is not None and stub.stdout.readline().strip() == "ready"
        out = subprocess.run(keda_argv(f"127.0.0.1:{port}", n, seconds, warmup, push, [],
                                       client_cpus, go),
                             stdout=subprocess.PIPE, env=env, text=True, check=True)
        got: dict[str, Any] = json.loads(out.stdout.splitlines()[-1])
        return got
    finally:
        stub.terminate()
        stub.wait(10)


def report_floor(got: dict[str, Any]) -> None:
    ch = got["chains"]
    lag99 = got["client_lag_p50_p99_max_ms"][1]
    print(f"  FLOOR (the same client, an empty-handler server on the scaler's core): HPA "
          f"chain p50 {ch['hpa']['p50_ms']:.2f} / p99 {ch['hpa']['p99_ms']:.2f} ms, poll "
          f"chain p50 {ch['poll']['p50_ms']:.2f} / p99 {ch['poll']['p99_ms']:.2f} ms, per "
          f"call p50 {got['call_p50_ms']:.2f} / p99 {got['call_p99_ms']:.2f} ms; errors "
          f"{got['errors'] or 0}; client loop late p99 {lag99:.2f} ms; client CPU "
          f"{got['client_cpu']:.0%}")


def report(got: dict[str, Any], floor_us: float, idle: list[float]) -> None:
    n, ch = got["objects"], got["chains"]
    print(f"\n{n:,} ScaledObjects{' with push' if got['push'] else ''}, "
          f"{got['seconds']:.0f} s measured:")
    print(f"  calls {got['calls']:,} ({got['calls_per_s']:,.0f}/s); errors "
          f"{got['errors'] or 0}; chains failed {got['chain_failures'] or 0}")
    print(f"  HPA chain p50 {ch['hpa']['p50_ms']:.2f} ms, p99 {ch['hpa']['p99_ms']:.2f} ms "
          f"({ch['hpa']['n']:,}); sync started late by p99 {got['hpa_late_p99_ms']:.1f} ms")
    print(f"  poll chain p50 {ch['poll']['p50_ms']:.2f} ms, p99 {ch['poll']['p99_ms']:.2f} ms "
          f"({ch['poll']['n']:,})")
    print(f"  per call p50 {got['call_p50_ms']:.2f} ms, p99 {got['call_p99_ms']:.2f} ms; "
          + ", ".join(f"{m} p99 {v['p99_ms']:.2f} ms ({v['n']:,})"
                      for m, v in got["per_method"].items()))
    lag50, lag99, lagmax = got["client_lag_p50_p99_max_ms"]
    print(f"  the KEDA client's own loop late (1 ms timer): p50 {lag50:.2f} ms, p99 "
          f"{lag99:.2f} ms, max {lagmax:.1f} ms")
    if len(got["answered_by_replica"]) > 1:
        print("  calls answered by each replica: "
              + ", ".join(f"{n:,.0f}" for n in got["answered_by_replica"]))
    if got["push"]:
        print(f"  streams delivered {got['streams_delivered']} (by the window: "
              f"{got['streams_delivered_by_warmup']}); stream errors "
              f"{got['stream_errors'] or 0}; pushes {got['pushes']:,}; first message p99 "
              f"{got['first_push_p99_s']:.2f} s")
    d50, d99 = got["update_delay_p50_p99_s"]
    print(f"  agent sample -> update applied (the scaler's histogram): p50 <= {d50 * 1e3:.0f} "
          f"ms, p99 <= {d99 * 1e3:.0f} ms")
    fresh = got["freshness_ms"]
    if fresh:
        print(f"  freshness (load flip -> GetMetrics moved): p50 {fresh[len(fresh) // 2]:.0f}"
              f" ms, max {fresh[-1]:.0f} ms ({len(fresh)} probes)"
              + (f"; not seen in 10 s: {'; '.join(got['unseen'])}" if got["unseen"] else ""))
    print("  scaler CPU " + ", ".join(f"{c:.0%}" for c in got["scaler_cpu"])
          + " of a core (ingest alone: " + ", ".join(f"{c:.0%}" for c in idle)
          + "), RSS " + ", ".join(f"{r:.0f}" for r in got["scaler_rss_mib"])
          + f" MiB; KEDA client CPU {got['client_cpu']:.0%} of a core, agent generators "
          f"{got['generators_cpu']:.0%}")
    if any(got.get("front_rss_mib", [])):
        print("  of which the gRPC front (--answer-process): CPU "
              + ", ".join(f"{c:.0%}" for c in got["front_cpu"]) + ", RSS "
              + ", ".join(f"{r:.0f}" for r in got["front_rss_mib"]) + " MiB")
    print("  GC in the (first) scaler: " + "; ".join(
        f"gen {g}: {n} x, {total * 1e3:.0f} ms in all, largest <= {top * 1e3:.0f} ms"
        for g, (n, total, top) in got["gc"].items() if n))
    extra = [c - i for c, i in zip(got["scaler_cpu"], idle, strict=True)]
    per_call = sum(extra) / max(got["calls_per_s"], 1) * 1e6
    print(f"  scaler CPU per call beyond ingest {per_call:.0f} µs = "
          f"{per_call / floor_us:.1f}x the yardstick")
    if got.get("lag_window"):
        print(f"  callbacks of the first scaler over {os.environ.get('GPUSCALE_LAG_MS', '4')} "
              f"ms in the measured window (+-1 s; count, ms in all, what ran):")
        for key, count, total in got["lag_window"][:20]:
            print(f"    {count}\t{total:.0f}\t{key}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--keda":
        target, n, seconds, warmup, push, ctl = sys.argv[2:8]
        asyncio.run(keda_main(target, int(n), float(seconds), float(warmup), push == "1",
                              json.loads(ctl)))
        return
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--objects", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--warmup", type=float, default=20.0,
                    help="seconds before the window (streams open, first polls)")
    ap.add_argument("--push", action="store_true", help="external-push: both streams per "
                    "ScaledObject")
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--generators", type=int, default=2)
    ap.add_argument("--agent-phases", choices=("independent", "grouped"),
                    default="independent",
                    help="independent: each agent ticks at a phase of its own, as real "
                         "agents do (default); grouped: 25 agents at once, 40 times a "
                         "second (bench_fleet's default, harsher)")
    ap.add_argument("--stream-memory-mib", type=int, default=1024,
                    help="each scaler's stream budget (1024, so one replica may hold "
                         "20,000 streams; the scaler's own default is 256)")
    ap.add_argument("--scaler-cores", type=int, default=1,
                    help="with --pin, cores each scaler replica gets (2: its answer "
                         "process may run beside it; needs a host with more cores)")
    ap.add_argument("--pin", action="store_true", help="pin each scaler replica to cores of "
                    "its own (--scaler-cores each), "
                    "the agents' generators and KEDA to the other cores")
    ap.add_argument("--floor", action="store_true",
                    help="first run the same KEDA client against an empty-handler server "
                         "(grpc_floor's keda-empty) on the scaler's core, generators "
                         "running: the client's and the transport's share of each figure")
    ap.add_argument("--answer-process", action="store_true",
                    help="run each scaler with --answer-process (KEDA's port in a child "
                         "process; CPU and RSS then include it)")
    ap.add_argument("--client", choices=("python", "go"), default="python",
                    help="the KEDA model: this file's (grpc.aio) or bench/keda_go's, in "
                         "KEDA's own language and gRPC library (built on first use; "
                         "Debian's Go and grpc-go packages, installed when missing)")
    ap.add_argument("--json", type=Path, help="write every figure here too")
    ap.add_argument("--lag-probe", action="store_true",
                    help="time the (first) scaler's event-loop callbacks (bench/lagprobe) and "
                         "print those that held it over 4 ms, over the whole run")
    args = ap.parse_args()
    lag_file = Path(f"/tmp/gpuscale-lag-{os.getpid()}.tsv")
    env = child_env(*([REPO / "bench" / "lagprobe"] if args.lag_probe else []))
    if args.lag_probe:
        env["GPUSCALE_LAG_FILE"] = str(lag_file)
    env["BENCH_FLEET_PHASES"] = args.agent_phases
    others = ""  # with --pin: each scaler replica on cores of its own, the rest for the others
    pin = args.scaler_cores if args.pin else 0
    if pin:
        count, used = os.cpu_count() or 1, args.replicas * pin
        if count <= used:
            raise SystemExit(f"--pin with --scaler-cores {pin} needs more than {used} cores")
        others = f"{used}-{count - 1}"
    go = build_go_client() if args.client == "go" else None
    floor_us = grpc_floor.floor()
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, grpcio {grpc.__version__}, "
          f"{time.strftime('%Y-%m-%d')}")
    print(f"yardstick: grpc.aio empty handler {floor_us:.0f} µs of server CPU per call")
    print("KEDA model: " + (f"grpc-go (bench/keda_go, {go_version()})" if go else
                            f"Python grpc.aio (grpcio {grpc.__version__})"))
    gens, controls, addrs = start_fleet(args.generators, env, others)
    scalers: list[Any] = []
    results = []
    floors = {}
    try:
        if args.floor:  # before the scalers: nothing else on their core
            for n in args.objects:
                floors[n] = run_floor(n, args.seconds, args.warmup, args.push, env,
                                      ",".join(map(str, range(pin))), others, go)
        scalers = start_scalers(args.replicas, addrs, env, pin, args.stream_memory_mib,
                                args.answer_process)
        c0, t0 = [proc_cpu_seconds(s[0].pid) for s in scalers], time.monotonic()
        time.sleep(10)
        idle = [(proc_cpu_seconds(s[0].pid) - c) / (time.monotonic() - t0)
                for s, c in zip(scalers, c0, strict=True)]
        target = ("ipv4:" + ",".join(f"127.0.0.1:{s[1]}" for s in scalers)
                  if len(scalers) > 1 else f"127.0.0.1:{scalers[0][1]}")
        print(f"{args.replicas} scaler replica(s), {AGENTS:,} agents x {PODS} pods at 1 Hz "
              f"({args.agent_phases} phases); one KEDA channel to {target}")
        for n in args.objects:
            got = run_keda(target, n, args.seconds, args.warmup, args.push, controls,
                           scalers, gens, env, others, go,
                           lag_file if args.lag_probe else None)
            got["ingest_cpu"], got["floor_us"] = idle, floor_us
            report(got, floor_us, idle)
            if n in floors:
                report_floor(floors[n])
                got["floor"] = floors[n]
            results.append(got)
            for s in scalers:  # a scaler that died is a result too
                if s[0].poll() is not None:
                    raise RuntimeError(f"a scaler exited with {s[0].returncode}")
        if args.lag_probe:
            time.sleep(2)  # the probe writes every second
            limit = os.environ.get("GPUSCALE_LAG_MS", "4")
            print(f"\nevent-loop callbacks of the first scaler over {limit} ms, the whole run "
                  "(count, ms in all, worst ms, what ran):")
            print(lag_file.read_text() if lag_file.exists() else "  (none written)")
    finally:
        for p in [s[0] for s in scalers] + gens:
            p.terminate()
            p.wait(10)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
