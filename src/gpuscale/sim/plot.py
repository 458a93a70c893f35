"""The PNG behind ``gpuscale simulate --plot``: load, replicas and latency over time, one
line per policy, on a shared time axis. matplotlib is an optional dependency
(``pip install 'gpuscale[plot]'``); everything else in ``simulate`` works without it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from gpuscale.common.plotting import PlotUnavailable
from gpuscale.models.slo import DEFAULT_SLO, SloSpec
from gpuscale.sim.compare import Comparison
from gpuscale.sim.simulate import Result
from gpuscale.traffic.trace import TraceRequest

# Worst TTFT above this is drawn at the ceiling (a minute never served is infinite).
_TTFT_CEILING_S = 600.0


def plot_results(found: Comparison, requests: Sequence[TraceRequest], duration: float,
                 path: Path, slo: SloSpec = DEFAULT_SLO) -> None:
    """The policies shown and the hindsight reference (dashed, black), each a line."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotUnavailable("--plot needs matplotlib: pip install 'gpuscale[plot]'") from exc

    minutes = max(1, math.ceil(duration / 60))
    per_minute = [0] * minutes
    for r in requests:
        per_minute[min(int(r.arrival_s // 60), minutes - 1)] += 1
    fig, (load, reps, lat) = plt.subplots(3, 1, sharex=True, figsize=(14, 9))
    load.step(range(minutes), per_minute, where="post", color="black")
    load.set_ylabel("requests / minute")
    load.set_title("load, replicas and worst time to first token per minute")
    lines: list[tuple[Result, dict[str, str]]] = [(res, {}) for res in found.results]
    if found.reference is not None:
        lines.append((found.reference.result, {"color": "black", "linestyle": "--"}))
    for res, style in lines:
        t = [p[0] / 60 for p in res.timeline]
        reps.step(t, [p[1] for p in res.timeline], where="post", label=res.policy, **style)
        lat.plot(t, [min(p[3], _TTFT_CEILING_S) or math.nan for p in res.timeline],
                 marker=".", linewidth=0.8, label=res.policy, **style)
    reps.set_ylabel("replicas")
    lat.axhline(slo.target_s, color="red", linestyle=":", linewidth=1,
                label=f"objective ({slo.describe()})")
    lat.set_yscale("log")
    lat.set_ylabel(f"worst per request, s (capped at {_TTFT_CEILING_S:g})")
    lat.set_xlabel("simulated minutes")
    # One legend, beside the panels: inside, it covers the lines.
    handles, labels = lat.get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(0.78, 0.5),
               fontsize="small", frameon=False)
    fig.tight_layout(rect=(0, 0, 0.78, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
