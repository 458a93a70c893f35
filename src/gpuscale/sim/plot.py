"""The PNG behind ``gpuscale simulate --plot``: load, replicas and latency over time, one
line per policy, on a shared time axis. matplotlib is an optional dependency
(``pip install 'gpuscale[plot]'``); everything else in ``simulate`` works without it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from gpuscale.common.plotting import PlotUnavailable
from gpuscale.models.slo import SLO_TTFT_S
from gpuscale.sim.simulate import Result
from gpuscale.traffic.trace import TraceRequest

# Worst TTFT above this is drawn at the ceiling (a minute never served is infinite).
_TTFT_CEILING_S = 600.0


def plot_results(results: Sequence[Result], requests: Sequence[TraceRequest], duration: float,
                 path: Path) -> None:
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
    fig, (load, reps, lat) = plt.subplots(3, 1, sharex=True, figsize=(11, 9))
    load.step(range(minutes), per_minute, where="post", color="black")
    load.set_ylabel("requests / minute")
    load.set_title("load, replicas and worst time to first token per minute")
    for res in results:
        t = [p[0] / 60 for p in res.timeline]
        reps.step(t, [p[1] for p in res.timeline], where="post", label=res.policy)
        lat.plot(t, [min(p[3], _TTFT_CEILING_S) or math.nan for p in res.timeline],
                 marker=".", linewidth=0.8, label=res.policy)
    reps.set_ylabel("replicas")
    reps.legend(fontsize="small", loc="upper left")
    lat.axhline(SLO_TTFT_S, color="red", linestyle="--", linewidth=1,
                label=f"SLO ({SLO_TTFT_S:g} s)")
    lat.set_yscale("log")
    lat.set_ylabel(f"worst TTFT, s (capped at {_TTFT_CEILING_S:g})")
    lat.set_xlabel("simulated minutes")
    lat.legend(fontsize="small", loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
