"""``gpuscale simulate``: replay a request trace through KEDA + HPA, policies side by side."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gpuscale.cli.common import fail
from gpuscale.models.serving import DEFAULT_GPU, GPU_TYPES
from gpuscale.models.slo import SLO_SPECS
from gpuscale.traffic.patterns import PATTERNS


def add_parser(sub: Any) -> None:
    sim = sub.add_parser("simulate", help="replay a request trace through KEDA + HPA and "
                                          "compare scaling policies")
    src = sim.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", type=Path,
                     help="a request trace: Azure LLM inference CSV (TIMESTAMP, "
                          "ContextTokens, GeneratedTokens; 2023 and 2024 files), JSONL "
                          "(Mooncake style: timestamp in ms, input_length, output_length), "
                          "or CSV arrival_s,input_tokens,output_tokens")
    src.add_argument("--pattern", choices=PATTERNS,
                     help="a synthetic load shape instead of a trace (with --duration; "
                          "--rate is then requests/s)")
    sim.add_argument("--min-replicas", type=int, default=1,
                     help="minReplicaCount for the autoscaled policies (0: scale to zero)")
    sim.add_argument("--rate", type=float, default=1.0,
                     help="multiply the arrivals (e.g. 8: eight times the traffic)")
    sim.add_argument("--speedup", type=float, default=1.0,
                     help="compress time (2: the trace plays in half the time)")
    sim.add_argument("--duration", type=float, default=None,
                     help="simulated seconds (default: the whole trace)")
    sim.add_argument("--loop", type=int, default=1,
                     help="play the trace this many times back to back (default 1)")
    sim.add_argument("--gpu", choices=sorted(GPU_TYPES), default=DEFAULT_GPU,
                     help=f"the GPU each replica runs on (default {DEFAULT_GPU})")
    sim.add_argument("--slo", choices=list(SLO_SPECS), default="ttft",
                     help="the objective each minute is judged by: "
                          + "; ".join(f"{k}: {v.describe()}" for k, v in SLO_SPECS.items()))
    sim.add_argument("--plot", type=Path, default=None,
                     help="also write a PNG: load, replicas and latency over time per "
                          "policy (needs matplotlib: pip install 'gpuscale[plot]')")
    sim.add_argument("--json", action="store_true", help="results as JSON")
    sim.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from gpuscale.sim.simulate import compare, format_results
    from gpuscale.traffic.requests import load_requests

    try:
        requests, duration = load_requests(args.pattern, args.trace, args.rate,
                                           args.duration, args.speedup, args.loop)
    except ValueError as exc:  # ConfigError and TraceError are ValueErrors
        return fail(str(exc), 2)
    if not requests:
        return fail("the pattern has no request in that duration", 2)
    slo = SLO_SPECS[args.slo]
    results = compare(requests, duration, GPU_TYPES[args.gpu], min_replicas=args.min_replicas,
                      progress=_progress_bar() if sys.stderr.isatty() else None, slo=slo)
    if args.plot is not None:
        from gpuscale.common.plotting import PlotUnavailable
        from gpuscale.sim.plot import plot_results

        try:
            plot_results(results, requests, duration, args.plot)
        except (PlotUnavailable, OSError) as exc:
            return fail(str(exc), 2)
        print(f"plot written to {args.plot}", file=sys.stderr)
    if args.json:
        print(json.dumps([{k: v for k, v in asdict(r).items()
                           if k not in ("timeline", "bad_minutes")}
                          for r in results], indent=2))
    else:
        print(f"{len(requests)} requests over {duration / 60:.0f} simulated minutes on "
              f"{args.gpu}; SLO per minute: {slo.describe()}")
        print(format_results(results))
        if slo.kind == "ttft":
            from gpuscale.sim.fluid_bound import lower_bound

            bound = lower_bound(requests, duration, GPU_TYPES[args.gpu], slo.target_s)
            print(f"lower bound for a per-request TTFT objective (sim/fluid_bound.py): "
                  f"{bound.gpu_hours:.2f} GPU-h")
    return 0


def _progress_bar(width: int = 30) -> Callable[[str, float], None]:
    """A one-line bar on stderr, redrawn in place; a newline when it reaches 100 %."""
    def show(policy: str, fraction: float) -> None:
        filled = int(width * fraction)
        end = "\n" if fraction >= 1.0 else ""
        sys.stderr.write(f"\r[{'#' * filled}{' ' * (width - filled)}] {fraction:4.0%} "
                         f"{policy[:40]:<40}{end}")
        sys.stderr.flush()
    return show
