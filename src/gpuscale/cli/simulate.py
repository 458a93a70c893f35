"""``gpuscale simulate``: replay a request trace through KEDA + HPA, policies side by side."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuscale.cli.common import fail
from gpuscale.cli.progress import progress_bar
from gpuscale.cli.simulate_sweep import check_jobs, run_sweep
from gpuscale.common.errors import GpuscaleError
from gpuscale.models.serving import DEFAULT_GPU, GPU_TYPES
from gpuscale.models.slo import SLO_SPECS
from gpuscale.sim.compare import SHOWN
from gpuscale.sim.reference import MAX_RUNS
from gpuscale.traffic.patterns import PATTERNS
from gpuscale.traffic.scale import RATE_MODES

if TYPE_CHECKING:
    from gpuscale.sim.compare import Comparison
    from gpuscale.sim.simulate import Result


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
                     help="minReplicaCount for the autoscaled policies (0: scale to zero; "
                          "gpuscale's triggers then name the gateway's queue as their "
                          "demandSource, and other scalers wake only on their own value)")
    sim.add_argument("--rate", type=float, default=1.0,
                     help="multiply the arrivals (e.g. 8: eight times the traffic, each "
                          "hour's load x8 where it was; see --rate-mode)")
    sim.add_argument("--rate-mode", choices=RATE_MODES, default="place",
                     help="how --rate adds a trace's load: place (default): copies of "
                          "each request within 30 s of its own time, a fraction thinned "
                          "at random (seeded), so the load keeps its shape over the day; "
                          "rotate: copies circularly shifted by a fraction of the trace's "
                          "span (the old mode: keeps the mean rate, moves the day's shape)")
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
                          "policy (needs matplotlib: the plot extra; checked before the "
                          "simulation, as the folder and the format from the suffix are)")
    sim.add_argument("--policies", default="all", metavar="KEYS",
                     help="comma-separated, in any order (default all): "
                          + ", ".join(SHOWN) + ". The reference starts from every "
                          "policy's schedule whichever are shown")
    sim.add_argument("--search-runs", default=str(MAX_RUNS), metavar="N|all",
                     help=f"simulations the hindsight reference's search may make "
                          f"(default {MAX_RUNS}; fewer: faster, maybe dearer; all: until "
                          f"it converges). The output says whether it converged")
    sim.add_argument("--sweep", action="store_true",
                     help="run every policy at several settings of its own knob (the "
                          "planner's utilization, KPA/APA targets, the queue model's "
                          "budget, static counts) and print the frontier of (GPU-hours, "
                          "SLO minutes) and the planner's curve against the best other "
                          "policy's; --plot draws the curves")
    sim.add_argument("--planner", action="append", default=[], metavar="KEY=VALUE",
                     help="a trigger key for the planner, repeatable (e.g. spareReplicas=1, "
                          "utilization=0.9; docs/planner.md); the objective's keys come from "
                          "--slo, and --sweep still sweeps utilization")
    sim.add_argument("--jobs", type=int, default=1, metavar="N",
                     help="--sweep: runs at once, in worker processes (default 1)")
    sim.add_argument("--json", action="store_true",
                     help="results as JSON: every policy, the reference and the bound")
    sim.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from gpuscale.sim.compare import compare, format_comparison, parse_policies
    from gpuscale.traffic.requests import load_requests

    try:
        shown = parse_policies(args.policies)
        search_runs = parse_search_runs(args.search_runs)
        check_jobs(args.jobs)
        args.planner = planner_keys(args.planner)
        if args.plot is not None:  # before the minutes of work, not after them
            from gpuscale.common.plotting import check_plot

            check_plot(args.plot)
        requests, duration = load_requests(args.pattern, args.trace, args.rate,
                                           args.duration, args.speedup, args.loop,
                                           rate_mode=args.rate_mode)
    except ValueError as exc:  # ConfigError and TraceError are ValueErrors
        return fail(str(exc), 2)
    except GpuscaleError as exc:  # PlotUnavailable: matplotlib is missing
        return fail(exc)
    except OSError as exc:
        return fail(f"cannot read the trace: {exc}", 2)
    if not requests:
        return fail("no request in that trace or duration", 2)
    slo = SLO_SPECS[args.slo]
    if args.sweep:
        return run_sweep(args, requests, duration, slo, shown)
    found = compare(requests, duration, GPU_TYPES[args.gpu], min_replicas=args.min_replicas,
                    progress=progress_bar(), slo=slo,
                    shown=shown, max_runs=search_runs, planner=args.planner)
    if args.plot is not None:
        from gpuscale.sim.plot import plot_results

        try:
            plot_results(found, requests, duration, args.plot, slo)
        except (GpuscaleError, OSError) as exc:  # checked first: a disk that filled up
            return fail(str(exc), 2)
        print(f"plot written to {args.plot}", file=sys.stderr)
    if args.json:
        print(json.dumps(as_json(found, len(requests), duration, args.gpu, slo.describe()),
                         indent=2))
    else:
        print(f"{len(requests)} requests over {duration / 60:.0f} simulated minutes on "
              f"{args.gpu}; SLO per minute: {slo.describe()}")
        print(format_comparison(found))
        print("vs ref: GPU-hours over the hindsight reference's (the cheapest schedule found\n"
              "knowing every arrival); vs bound: over the fluid lower bound. The cheapest\n"
              "possible lies between the two.")
    return 0


def planner_keys(items: Sequence[str]) -> dict[str, str]:
    """``--planner`` KEY=VALUE items as trigger metadata, checked as the scaler checks a
    trigger's (ValueError naming the option and the key)."""
    from gpuscale.scaler.core.trigger import PLANNER_KEYS, MetadataError, parse_metadata
    from gpuscale.sim.compare import OBJECTIVE_KEYS

    keys: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--planner: KEY=VALUE, not {item[:40]!r}")
        if key in OBJECTIVE_KEYS:
            raise ValueError(f"--planner: {key} is the objective's: give it with --slo")
        if key not in PLANNER_KEYS:
            raise ValueError(f"--planner: {key[:40]!r} is not a planner key; they are "
                             f"{', '.join(sorted(PLANNER_KEYS - OBJECTIVE_KEYS))}")
        keys[key] = value
    try:
        parse_metadata({"profile": "vllm-planner", **keys})
    except MetadataError as exc:
        raise ValueError(f"--planner: {exc}") from None
    return keys


def parse_search_runs(text: str) -> int | None:
    """``--search-runs``: a count of at least 0, or ``all`` (None: until it converges).
    ValueError naming the option."""
    if text.strip() == "all":
        return None
    if not re.fullmatch(r"[0-9]{1,12}", text.strip(), re.ASCII):  # not "٤", nor 10^40
        raise ValueError(f"--search-runs: a count of at least 0, or all; not {text[:20]!r}")
    return int(text)


def as_json(found: Comparison, requests: int, duration: float, gpu: str,
            slo: str) -> dict[str, Any]:
    """Everything the table shows and more: each result's figures (not its timeline), its
    gaps, the reference's search and the bound's parts."""
    def row(r: Result) -> dict[str, Any]:
        out = {k: v for k, v in asdict(r).items()
               if k not in ("timeline", "bad_minutes", "steps", "stopped_at")}
        out["gap_to_reference"] = found.gap(r, "reference")
        out["gap_to_bound"] = found.gap(r, "bound")
        return out

    ref = found.reference
    return {
        "requests": requests, "duration_s": duration, "gpu": gpu, "slo": slo,
        "policies": [row(r) for r in found.results],
        "reference": None if ref is None else {
            **row(ref.result), "search_start": ref.start,
            "search_start_gpu_hours": ref.start_gpu_hours, "search_runs": ref.runs,
            "search_complete": ref.complete, "search_state": ref.state,
            "search_budget": ref.max_runs, "search_step_s": ref.step_s,
            "search_last_improvement_run": ref.last_improvement,
            "search_savings": [{"run": run, "gpu_hours": hours}
                               for run, hours in ref.savings]},
        "bound": None if found.bound is None else asdict(found.bound),
        "bound_missing": found.bound_missing,
    }
