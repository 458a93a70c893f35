"""The PNG behind ``gpuscale simulate --sweep --plot``: each policy's curve of (GPU-hours,
SLO minutes) over its knob's settings, the planner's drawn thick, the frontier of every run
as a grey band under them, each policy's default as a hollow marker; a curve is a staircase
(with x GPU-hours, the fewest minutes its settings reach). A point lower and to
the left is better: fewer minutes missed for fewer GPU-hours. matplotlib is optional
(the ``plot`` extra; common.plotting says how to install it)."""

from __future__ import annotations

from pathlib import Path

from gpuscale.common.plotting import load_pyplot
from gpuscale.sim.sweep import PLANNER, Sweep


def plot_sweep(s: Sweep, path: Path, title: str = "", dpi: int = 110) -> None:
    """Write the curves to ``path`` (PlotUnavailable without matplotlib; OSError as the
    file system gives it)."""
    plt = load_pyplot()  # PlotUnavailable without matplotlib
    fig, ax = plt.subplots(figsize=(9, 6))
    try:
        # Twenty colours: a sweep draws 13 policies, and ten repeat two of them.
        ax.set_prop_cycle(color=plt.get_cmap("tab20").colors)
        frontier = s.frontier
        ax.step([p.gpu_hours for p in frontier], [p.slo_minutes for p in frontier],
                where="post", color="0.8", linewidth=8, label="frontier of every run",
                zorder=1)
        for key in dict.fromkeys(p.key for p in s.points):
            mine = sorted((p for p in s.points if p.key == key), key=lambda p: p.gpu_hours)
            curve = s.curve(key)
            planner = key == PLANNER
            # A staircase: with x GPU-hours, the fewest minutes its settings reach.
            line = ax.step([p.gpu_hours for p in curve], [p.slo_minutes for p in curve],
                           where="post", marker="o", linewidth=3 if planner else 1.2,
                           color="black" if planner else None, label=mine[0].policy,
                           zorder=3 if planner else 2)[0]
            others = [p for p in mine if p not in curve]
            ax.scatter([p.gpu_hours for p in others], [p.slo_minutes for p in others],
                       marker=".", color=line.get_color(), zorder=2)
            for p in mine:
                if p.default:
                    ax.scatter([p.gpu_hours], [p.slo_minutes], s=140, facecolors="none",
                               edgecolors=line.get_color(), linewidths=1.5, zorder=4)
        ax.set_xlabel("GPU-hours")
        ax.set_ylabel(f"SLO-violating minutes ({s.slo.describe()})")
        ax.set_title((title + "\n" if title else "")
                     + "each policy over its knob (hollow: its default; grey: the frontier)",
                     fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
        fig.tight_layout()
        fig.savefig(path, dpi=dpi)
    finally:
        plt.close(fig)
