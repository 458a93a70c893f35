"""``gpuscale simulate --sweep``: every policy over its own knob on one load (``sim.sweep``),
printed as a table, as JSON, and drawn with ``--plot``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from gpuscale.cli.common import fail
from gpuscale.cli.progress import progress_bar
from gpuscale.common.errors import GpuscaleError
from gpuscale.models.serving import GPU_TYPES
from gpuscale.models.slo import SloSpec
from gpuscale.traffic.trace import TraceRequest

MAX_JOBS = 64


def check_jobs(jobs: int) -> None:
    """``--jobs``: 1 to ``MAX_JOBS`` worker processes. ValueError naming the option."""
    if not 1 <= jobs <= MAX_JOBS:
        raise ValueError(f"--jobs: 1 to {MAX_JOBS} worker processes, not {jobs}")


def run_sweep(args: argparse.Namespace, requests: Sequence[TraceRequest], duration: float,
              slo: SloSpec, shown: Sequence[str]) -> int:
    """The sweep over the policies in ``shown`` (the reference and the bound are not
    swept), printed or as JSON, and plotted when ``--plot`` names a file."""
    from gpuscale.sim.compare import POLICIES
    from gpuscale.sim.sweep import format_sweep, sweep, sweep_json

    keys = [k for k in shown if k in POLICIES]
    if not keys:
        return fail("--sweep: name at least one policy in --policies (the reference and "
                    "the bound are not swept)", 2)
    found = sweep(requests, duration, GPU_TYPES[args.gpu], slo=slo,
                  min_replicas=args.min_replicas, keys=keys, jobs=args.jobs,
                  progress=progress_bar(), planner_metadata=args.planner)
    head = (f"{len(requests)} requests over {duration / 60:.0f} simulated minutes on "
            f"{args.gpu}; SLO per minute: {slo.describe()}; {len(found.points)} runs")
    if args.plot is not None:
        from gpuscale.sim.sweep_plot import plot_sweep

        try:
            plot_sweep(found, args.plot, head)
        except (GpuscaleError, OSError) as exc:
            return fail(str(exc), 2)
        print(f"plot written to {args.plot}", file=sys.stderr)
    if args.json:
        print(json.dumps({"requests": len(requests), "duration_s": duration, "gpu": args.gpu,
                          **sweep_json(found)}, indent=2))
    else:
        print(head)
        print(format_sweep(found))
    return 0
