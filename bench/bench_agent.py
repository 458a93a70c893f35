"""Agent cost with the fake NVML at 8 GPUs x 7 MIG instances x 64 processes.

Prints, for BENCHMARKS.md:
  1. one sample: wall and CPU time per NvmlBackend.sample(), and NVML calls per sample
     (the fake answers in well under a microsecond; a real driver call costs more, so the
     call count is what to scale by on real hardware);
  2. the agent process (gpuscale agent --gpu-backend nvml, 1 Hz, /metrics scraped every
     15 s like Prometheus): CPU as % of one core, RSS and peak RSS;
  3. RSS of the interpreter with the agent's imports only (what the floor is).

Usage: .venv/bin/python bench/bench_agent.py [--duration 60] [--samples 300]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.proc import measure_agent  # noqa: E402
from tests.peers.fakenvml import big_mig_scenario, build  # noqa: E402

SAMPLE_CODE = textwrap.dedent("""
    import json, statistics, sys, time
    import pynvml
    from gpuscale.telemetry.nvml import NvmlBackend
    n = int(sys.argv[1])
    b = NvmlBackend(interval=1.0, node="bench")
    first = b.sample()
    assert first.state.value == "ok" and len(first.gpus) == 8, first.reason
    assert sum(len(g.migs) for g in first.gpus) == 56
    assert sum(len(g.processes) for g in first.gpus) == 64
    walls, cpus = [], []
    for _ in range(n):
        w0, c0 = time.perf_counter(), time.thread_time()
        b.sample()
        walls.append(time.perf_counter() - w0); cpus.append(time.thread_time() - c0)
        time.sleep(0.002)
    # Rendering one scrape of the latest snapshot (what /metrics does per request).
    from prometheus_client import CollectorRegistry, generate_latest
    from gpuscale.agent.exporter import SnapshotCollector
    registry = CollectorRegistry(auto_describe=False)
    latest = b.sample()
    registry.register(SnapshotCollector(lambda: latest, "bench"))
    renders = []
    for _ in range(50):
        r0 = time.thread_time()
        body = generate_latest(registry)
        renders.append(time.thread_time() - r0)
    # Count NVML calls in one more sample by wrapping the bindings' entry points.
    calls = [0]
    def counted(fn):
        def wrapper(*a, **k):
            calls[0] += 1
            return fn(*a, **k)
        return wrapper
    for name in dir(pynvml):
        if name.startswith("nvml") and callable(getattr(pynvml, name)):
            setattr(pynvml, name, counted(getattr(pynvml, name)))
    b.sample()
    walls.sort(); cpus.sort()
    print(json.dumps({"median_ms": statistics.median(walls) * 1e3,
                      "p99_ms": walls[int(len(walls) * 0.99) - 1] * 1e3,
                      "cpu_median_ms": statistics.median(cpus) * 1e3, "calls": calls[0],
                      "render_ms": statistics.median(renders) * 1e3, "body": len(body)}))
""")

IMPORT_CODE = textwrap.dedent("""
    import gpuscale.cli, gpuscale.agent.app, gpuscale.telemetry.nvml, pynvml, aiohttp.web
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            print(int(line.split()[1]) // 1024)
""")




def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=60.0, help="agent measurement, s")
    parser.add_argument("--samples", type=int, default=300, help="samples for part 1")
    args = parser.parse_args()

    lib = build()
    tmp = Path(tempfile.mkdtemp(prefix="gpuscale-bench-"))
    scenario = tmp / "scenario.txt"
    scenario.write_text(big_mig_scenario(gpus=8, migs=7, procs_per_gpu=8))
    env = {**os.environ, "LD_LIBRARY_PATH": str(lib), "FAKENVML_SCENARIO": str(scenario),
           "FAKENVML_STATIC": "1", "PYTHONUNBUFFERED": "1"}

    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}")
    print("fake NVML: 8 GPUs x 7 MIG 1g.10gb (GPM on), 64 processes\n")

    out = subprocess.run([sys.executable, "-c", SAMPLE_CODE, str(args.samples)], env=env,
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        sys.exit(f"sample benchmark failed:\n{out.stderr}")
    one = json.loads(out.stdout)
    print(f"1. one sample ({args.samples} samples): wall median {one['median_ms']:.2f} ms, "
          f"p99 {one['p99_ms']:.2f} ms; CPU median {one['cpu_median_ms']:.2f} ms; "
          f"{one['calls']} NVML calls per sample")
    print(f"   rendering /metrics: {one['render_ms']:.2f} ms CPU for {one['body'] // 1024} KiB")

    print("2. " + measure_agent(
        ["--gpu-backend", "nvml", "--host", "127.0.0.1", "--port", "0", "--interval", "1",
         "--stream-port", "-1"],
        env, args.duration))

    floor = subprocess.run([sys.executable, "-c", IMPORT_CODE], env=env, capture_output=True,
                           text=True, check=True)
    print(f"3. interpreter + agent imports only: RSS {floor.stdout.strip()} MiB")


if __name__ == "__main__":
    main()
