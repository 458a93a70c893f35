"""The PNG behind ``gpuscale simulate --plot``: one small panel per policy, read at a glance.

On top, the load (requests per minute). Below, a panel per policy - and the hindsight
reference - on shared axes: its replicas over time (a step line; the planner's panel adds
its steady, burst and kv terms per minute, in replicas), the reference's
replicas as a dashed grey line in every panel to compare against, and each minute that
missed the objective as a red band. Panels are ordered by SLO-violating minutes, then
GPU-hours, so the cheapest policy that keeps the objective best comes first among the policies; its
title is bold (the reference is a figure, not a policy: never bold, and said so), and every
title carries its GPU-hours and missed minutes. The replicas axis is
clipped at three times the reference's peak (at least 10): a policy that runs far above
says so in its panel ("up to N") instead of flattening every other line. matplotlib is an
optional dependency (``pip install 'gpuscale[plot]'``); everything else in ``simulate``
works without it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from gpuscale.common.plotting import load_pyplot
from gpuscale.models.slo import DEFAULT_SLO, SloSpec
from gpuscale.sim.compare import POLICIES, Comparison
from gpuscale.sim.simulate import Result
from gpuscale.traffic.trace import TraceRequest

COLUMNS = 3
PLANNER = POLICIES["planner"]
CLIP_X_REFERENCE = 3  # the replicas axis ends at this many times the reference's peak
MIN_CLIP = 10


def panels(found: Comparison) -> list[Result]:
    """The results a panel each, best first: fewest SLO minutes, then fewest GPU-hours
    (the reference among them)."""
    results = list(found.results)
    if found.reference is not None:
        results.append(found.reference.result)
    return sorted(results, key=lambda r: (r.slo_violation_minutes, r.gpu_hours, r.policy))


def plot_results(found: Comparison, requests: Sequence[TraceRequest], duration: float,
                 path: Path, slo: SloSpec = DEFAULT_SLO) -> None:
    plt = load_pyplot()  # PlotUnavailable without matplotlib

    minutes = max(1, math.ceil(duration / 60))
    per_minute = [0] * minutes
    for r in requests:
        per_minute[min(int(r.arrival_s // 60), minutes - 1)] += 1
    shown = panels(found)
    rows = math.ceil(len(shown) / COLUMNS)
    reference = found.reference.result if found.reference is not None else None
    peak = max((p[1] for p in reference.timeline), default=1) if reference else \
        max((p[1] for r in shown for p in r.timeline), default=1)
    top = max(MIN_CLIP, CLIP_X_REFERENCE * peak)
    fig = plt.figure(figsize=(4.6 * COLUMNS, 1.8 + 2.2 * rows))
    grid = fig.add_gridspec(rows + 1, COLUMNS, height_ratios=[1.0] + [1.3] * rows)
    load = fig.add_subplot(grid[0, :])
    load.step(range(minutes), per_minute, where="post", color="black", linewidth=1)
    load.set_ylabel("requests/min")
    load.set_xlim(0, minutes)
    load.set_title(f"load; below, replicas per policy (dashed grey: the hindsight "
                   f"reference; red: minutes that missed {slo.describe()})", fontsize=10)
    best = next((r for r in shown if r is not reference), None)
    first = None
    for i, res in enumerate(shown):
        ax = fig.add_subplot(grid[1 + i // COLUMNS, i % COLUMNS], sharex=load,
                             sharey=first)
        first = first or ax
        t = [p[0] / 60 for p in res.timeline]
        replicas = [p[1] for p in res.timeline]
        for minute in res.bad_minutes:
            ax.axvspan(minute, minute + 1, color="red", alpha=0.25, linewidth=0)
        if reference is not None and res is not reference:
            ax.step([p[0] / 60 for p in reference.timeline],
                    [p[1] for p in reference.timeline], where="post", color="grey",
                    linestyle="--", linewidth=0.9)
        ax.step(t, replicas, where="post", color="tab:blue", linewidth=1.4)
        if res.policy == PLANNER and found.planner_terms:  # why it planned what it did
            minutes_at = [m + 0.5 for m, *_ in found.planner_terms]
            for i_term, (label, color) in enumerate((("steady", "tab:green"),
                                                     ("burst", "tab:orange"),
                                                     ("kv", "tab:purple"))):
                ax.plot(minutes_at, [min(v[1 + i_term], top) for v in found.planner_terms],
                        color=color, linewidth=0.8, label=f"{label} term")
            ax.legend(loc="upper left", fontsize=6.5, frameon=False, ncol=3)
        ax.set_ylim(0, top)
        highest = max(replicas, default=0)
        if highest > top:
            ax.text(0.98, 0.92, f"up to {highest}", transform=ax.transAxes, ha="right",
                    va="top", fontsize=8, color="tab:blue")
        name = ("hindsight reference (knows every arrival)" if res is reference
                else res.policy[:38] + ("  - cheapest that keeps it best" if res is best
                                        else ""))
        ax.set_title(f"{name}\n{res.gpu_hours:.2f} GPU-h, "
                     f"{res.slo_violation_minutes} SLO min", fontsize=8.5,
                     fontweight="bold" if res is best else "normal")
        if i % COLUMNS == 0:
            ax.set_ylabel("replicas")
        if i // COLUMNS == rows - 1:
            ax.set_xlabel("minutes")
        ax.tick_params(labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
