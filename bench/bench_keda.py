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

The KEDA model is bench/keda_model.py (Python, grpc.aio) or, with ``--client go``,
bench/keda_go's (built by bench/keda_go_build.py):
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
import json
import os
import platform
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import grpc  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from bench import grpc_floor  # noqa: E402
from bench.bench_fleet import free_port, histogram_quantiles  # noqa: E402
from bench.keda_go_build import build_go_client, go_version  # noqa: E402
from bench.keda_model import keda_argv  # noqa: E402
from bench.proc import child_env, children, proc_cpu_seconds, proc_mem_mib  # noqa: E402

AGENTS, PODS = 1000, 8


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


def arguments() -> argparse.ArgumentParser:
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
                    help="the KEDA model: bench/keda_model.py's (grpc.aio) or bench/keda_go's, in "
                         "KEDA's own language and gRPC library (built on first use; "
                         "Debian's Go and grpc-go packages, installed when missing)")
    ap.add_argument("--json", type=Path, help="write every figure here too")
    ap.add_argument("--lag-probe", action="store_true",
                    help="time the (first) scaler's event-loop callbacks (bench/lagprobe) and "
                         "print those that held it over 4 ms, over the whole run")
    return ap


def main() -> None:
    args = arguments().parse_args()
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
