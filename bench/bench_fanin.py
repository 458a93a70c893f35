"""Where one scaler stops: the fleet benchmark at several fleet sizes, and a model fitted to
it, for BENCHMARKS.md and docs/fleet.md's sharding story.

Runs ``bench/bench_fleet.py --agents N`` (real agents' telemetry streams from generator
processes into the real ``gpuscale scaler``, 8 pods per agent at 1 Hz) for each N, reads
the scaler's own CPU (% of one core, updates only), RSS and update delay, fits CPU and RSS
as lines in N (least squares), and projects the fleet size at which one scaler's event
loop is saturated (100 % of a core: updates queue without bound, and every answer waits
behind them), at which it keeps 30 % headroom for KEDA's calls, streams and the metrics
API, and at which its RSS would reach 300 MiB. The projection is a model fitted to
measurements on this machine, not a measurement at the projected size: generators and
scaler share the same 2 cores, so sizes beyond ~1,500 agents cannot be measured here.

Agents stream their devices too (for the operator tools), as real ones do; ``--no-devices``
measures pods only. The yardstick (grpc.aio's empty-handler CPU per call,
bench/grpc_floor.py) is measured first, in the same run.

Usage: .venv/bin/python bench/bench_fanin.py [--sizes 250 500 1000 1500] [--seconds 20]
       [--no-devices]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PATTERNS = {
    "cpu": r"scaler CPU (\d+) % of one core",
    "rss": r"RSS (\d+) MiB",
    "p99": r"update delay \(histogram, \d+ updates\): p50 <= \d+ ms, p99 <= (\d+) ms",
    "probe_max": r"GetMetrics changed: p50 \d+ ms, max (\d+) ms",
}


def run(agents: int, seconds: float, devices: bool) -> dict[str, float]:
    argv = [sys.executable, str(REPO / "bench" / "bench_fleet.py"), "--agents", str(agents),
            "--seconds", str(seconds), *([] if devices else ["--no-devices"])]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=900).stdout
    got = {}
    for key, pattern in PATTERNS.items():
        m = re.search(pattern, out)
        if m is None:
            raise RuntimeError(f"bench_fleet output without {key}:\n{out}")
        got[key] = float(m.group(1))
    return got


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares line: (intercept, slope)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return my - slope * mx, slope


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[250, 500, 1000, 1500])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--no-devices", action="store_true",
                    help="agents stream pods only (the table before the operator tools)")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    from bench.grpc_floor import floor

    floor_us = floor()
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}; yardstick: "
          f"grpc.aio empty handler {floor_us:.0f} µs of server CPU per call")
    print("agents stream " + ("pods only" if args.no_devices else
                              "pods and their 8 GPUs (as real agents do)"))
    rows = []
    for n in args.sizes:
        r = run(n, args.seconds, not args.no_devices)
        rows.append((n, r))
        print(f"  {n:5d} agents ({8 * n:6d} pods): scaler CPU {r['cpu']:3.0f} % of a core, "
              f"RSS {r['rss']:4.0f} MiB, update delay p99 <= {r['p99']:.0f} ms, load flip "
              f"-> answer max {r['probe_max']:.0f} ms", flush=True)
    xs = [float(n) for n, _ in rows]
    if len(set(xs)) < 2:
        print("fit: needs two or more different --sizes")
        return
    cpu0, cpu_per = fit(xs, [r["cpu"] for _, r in rows])
    rss0, rss_per = fit(xs, [r["rss"] for _, r in rows])
    print(f"fit: CPU {cpu0:.1f} % + {cpu_per * 1000:.1f} % per 1,000 agents; "
          f"RSS {rss0:.0f} MiB + {rss_per * 1000:.0f} MiB per 1,000 agents")
    if cpu_per <= 0 or rss_per <= 0:
        print("  no projection: CPU or RSS did not grow with the agents in this run "
              "(sizes too close, or too few seconds)")
        return
    for label, cpu in (("saturated (100 % of a core)", 100.0),
                       ("70 % of a core (headroom for answers)", 70.0)):
        print(f"  one scaler {label}: ~{(cpu - cpu0) / cpu_per:,.0f} agents")
    print(f"  RSS 300 MiB: ~{(300 - rss0) / rss_per:,.0f} agents")


if __name__ == "__main__":
    main()
