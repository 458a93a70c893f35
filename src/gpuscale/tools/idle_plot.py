"""``gpuscale idle --plot``: GPUs allocated and used over the window, as a PNG (matplotlib,
the optional extra ``gpuscale[plot]``)."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from gpuscale.common.plotting import load_pyplot
from gpuscale.tools.idle import Report


def plot_report(report: Report, source: str, path: Path) -> None:
    """Write the PNG; PlotUnavailable without matplotlib, OSError when ``path`` cannot be
    written."""
    plt = load_pyplot()  # PlotUnavailable without matplotlib

    points = list(report.timeline)
    if points:  # a step plot needs the last bucket's end
        points.append(replace(points[-1], start=report.now))
    t = [(p.start - report.now) / 60 for p in points]  # minutes before now
    fig, ax = plt.subplots(figsize=(11, 4.5))
    ax.step(t, [p.allocated for p in points], where="post", label="allocated")
    ax.step(t, [p.measured for p in points], where="post", linestyle=":",
            label="allocated with a utilization reading")
    ax.step(t, [p.used for p in points], where="post", label="used")
    o = report.options
    ax.set_title(f"GPUs allocated and used ({source}"
                 f"{', namespace ' + o.namespace if o.namespace else ''})")
    ax.set_ylabel("GPUs (mean over each bucket)")
    ax.set_xlabel(f"minutes before {time.strftime('%Y-%m-%d %H:%M', time.gmtime(report.now))} "
                  f"UTC")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize="small", loc="upper left")
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)
