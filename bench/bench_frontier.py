"""The cost/SLO frontier on every load of the planner's benchmark: every policy over its own
knob (``gpuscale simulate --sweep``'s runs, ``sim.sweep``) on the shipped trace x1-x8 and
every generated shape with both seeds, and the issue's tests of the planner on it.

Per load, the planner at its default against:

- **defaults**: every other online policy at its documented default - none may give no
  more SLO minutes for ``ONLINE_MARGIN`` (3 %) fewer GPU-hours;
- **static**: a constant fleet at every count the sweep tries (from 3 below the work's
  peak to 1 above it, the hindsight peak among them) - none may give no more minutes for
  ``STATIC_MARGIN`` (5 %) fewer;
- **the knob**: as ``utilization`` rises, the planner's GPU-hours never rise and its SLO
  minutes never fall (monotone: a team can move along the curve one way);
- **curves** (on the loads of ``CURVE_LOADS``): at every number of SLO minutes within
  the planner's reach (from the fewest to the most its settings give) the planner's
  swept curve costs no more GPU-hours than the best baseline's (``TIE``: within 0.5 % is
  a tie); outside it, what only a baseline reaches is named: fewer minutes, or fewer
  GPU-hours for more minutes than the planner ever misses.

Tuned loads (the shipped trace, ``bursts`` and ``diurnal`` seed 1) are marked apart from
held-out ones. The hindsight reference is ``bench_simulate.py``'s (it searches hundreds of
runs per load); this bench sweeps the policies only.

Usage: .venv/bin/python bench/bench_frontier.py [--quick] [--jobs N] [--loads A,B]
           [--rate-mode place|rotate] [--plots DIR] [--json FILE] [--set KEY=VALUE ...]
       .venv/bin/python bench/bench_frontier.py --from FILE [--plots DIR]
           (judge a --json run again, and plot it, without simulating)
  --loads: names as printed, '-' for a space ("trace-x2,burst10-s1")
  --plots DIR: one PNG per load (matplotlib: pip install -e '.[plot]')
  --set: a planner trigger key for every planner run (its knob still swept)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.bench_simulate import Case, cases  # noqa: E402
from gpuscale.models.serving import ServingParams  # noqa: E402
from gpuscale.models.slo import DEFAULT_SLO  # noqa: E402
from gpuscale.sim.compare import POLICIES  # noqa: E402
from gpuscale.sim.sweep import (  # noqa: E402
    PLANNER,
    STATIC,
    LevelRow,
    Sweep,
    SweepPoint,
    sweep,
    sweep_json,
)

ONLINE_MARGIN = 0.03  # an online policy's default this much cheaper at as few minutes
STATIC_MARGIN = 0.05  # a constant fleet this much cheaper at as few minutes
TIE = 0.005  # GPU-hours within this fraction are a tie on a curve
PLOT_DPI = 72  # small enough to keep one per load in docs/frontier/
CURVE_LOADS = ("trace x2", "trace x4", "long-prompts s1", "long-prompts s2", "burst10 s1",
               "burst10 s2", "noisy-diurnal s1", "noisy-diurnal s2")


def knob_monotone(points: Sequence[tuple[float, float]]) -> bool:
    """(GPU-hours, SLO minutes) in the knob's rising order: the hours never rise and the
    minutes never fall (a team can move along the curve one way)."""
    return all(a[0] >= b[0] - 1e-9 and a[1] <= b[1] + 1e-9 for a, b in pairwise(points))


@dataclass(frozen=True, slots=True)
class Verdict:
    """The planner's default and the runs that beat it, and its curve against the rest."""

    case: str
    tuned: bool
    planner: SweepPoint
    online: tuple[SweepPoint, ...]  # defaults of other online policies that beat it
    static: tuple[SweepPoint, ...]  # constant fleets that beat it
    levels: tuple[LevelRow, ...]  # the planner's curve against the best baseline's
    curve_checked: bool
    knob: tuple[SweepPoint, ...]  # the planner at each setting, the knob rising

    @property
    def on_frontier(self) -> bool:
        return not self.online and not self.static

    @property
    def monotone(self) -> bool:
        return knob_monotone([(p.gpu_hours, p.slo_minutes) for p in self.knob])

    @property
    def reach(self) -> tuple[int, int]:
        """The fewest and the most SLO minutes the planner's settings give."""
        return (min(p.slo_minutes for p in self.knob), max(p.slo_minutes for p in self.knob))

    @property
    def curve_ok(self) -> bool:
        """Within the planner's reach, at or below the best baseline's curve."""
        fewest, most = self.reach
        return all((r.gap or 0.0) <= TIE for r in self.levels
                   if r.baseline is not None and fewest <= r.slo_minutes <= most)


def judge(name: str, tuned: bool, s: Sweep) -> Verdict:
    """The tests of the module's docstring on one load's sweep."""
    mine = next(p for p in s.points if p.key == PLANNER and p.default)
    online = tuple(p for p in s.points if p.key not in (PLANNER, STATIC) and p.default
                   and _beats(p, mine, ONLINE_MARGIN))
    static = tuple(p for p in s.points if p.key == STATIC and _beats(p, mine, STATIC_MARGIN))
    checked = name in CURVE_LOADS
    knob = tuple(sorted((p for p in s.points if p.key == PLANNER),
                        key=lambda p: p.setting or 0.0))
    return Verdict(name, tuned, mine, online, static, tuple(s.levels()), checked, knob)


def _beats(p: SweepPoint, mine: SweepPoint, margin: float) -> bool:
    return p.slo_minutes <= mine.slo_minutes and p.gpu_hours < mine.gpu_hours * (1 - margin)


def table(verdicts: Sequence[Verdict]) -> str:
    """One row per load: the planner's default, what beats it, its curve's worst gap."""
    head = ("| load | planner GPU-h / min | online default cheaper by >= 3 % | static "
            "cheaper by >= 5 % | knob monotone | curve vs baselines |")
    lines = [head, "| --- | --- | --- | --- | --- | --- |"]
    for v in verdicts:
        name = v.case + ("" if not v.tuned else " (tuned)")
        online = ", ".join(_said(p) for p in v.online) or "none"
        static = ", ".join(_said(p) for p in v.static) or "none"
        lines.append(f"| {name} | {v.planner.gpu_hours:.2f} / {v.planner.slo_minutes} | "
                     f"{online} | {static} | {_knob(v)} | {_curve(v)} |")
    return "\n".join(lines)


def _said(p: SweepPoint) -> str:
    what = p.policy if p.key != STATIC else f"static {p.setting:g}"
    return f"{what} {p.gpu_hours:.2f} / {p.slo_minutes}"


def _knob(v: Verdict) -> str:
    if v.monotone:
        return "yes"
    return "no: " + ", ".join(f"{p.setting:g} {p.gpu_hours:.2f} / {p.slo_minutes}"
                              for p in v.knob)


def _curve(v: Verdict) -> str:
    """Where the planner's curve reaches, its worst gap to the best baseline's; where only
    a baseline reaches (fewer minutes than the planner's fewest, or cheaper at more
    minutes than its most), what it gives."""
    if not v.curve_checked:
        return "-"
    rows = [r for r in v.levels if r.baseline is not None]
    fewest, most = v.reach
    inside = [r for r in rows if fewest <= r.slo_minutes <= most]
    worst = max(inside, key=lambda r: r.gap or 0.0, default=None)
    said = ["at or below" if worst is None or (worst.gap or 0.0) <= TIE else
            f"{worst.gap:+.0%} at {worst.slo_minutes} min"]
    below = [r for r in rows if r.slo_minutes < fewest]
    if below:
        b = below[0].baseline
        assert b is not None
        said.append(f"fewer minutes only by baselines ({_said(b)})")
    above = [r for r in rows if r.baseline is not None and r.baseline.slo_minutes > most
             and (r.gap or 0.0) > TIE]
    if above:  # the nearest: what a team gives up least minutes for
        b = above[0].baseline
        assert b is not None
        said.append(f"cheaper at more minutes ({_said(b)})")
    return "; ".join(said)


def tally(verdicts: Sequence[Verdict]) -> str:
    """How many loads pass each test, tuned and held out apart."""
    lines = []
    for label, tuned in (("tuned", True), ("held out", False)):
        mine = [v for v in verdicts if v.tuned == tuned]
        if not mine:
            continue
        curves = [v for v in mine if v.curve_checked]
        lines.append(f"{label}: {len(mine)} loads; no online default cheaper "
                     f"{sum(not v.online for v in mine)}, no static cheaper "
                     f"{sum(not v.static for v in mine)}, both {sum(v.on_frontier for v in mine)}"
                     f"; knob monotone {sum(v.monotone for v in mine)}"
                     + (f"; curve at or below every baseline's within its reach on "
                        f"{sum(v.curve_ok for v in curves)} of {len(curves)}" if curves else ""))
    return "\n".join(lines)


def _read(load: dict[str, Any]) -> Sweep:
    """A load's sweep back from ``sweep_json``'s runs."""
    return Sweep(tuple(SweepPoint(r["key"], r["policy"], r["knob"], r["setting"], r["default"],
                                  r["gpu_hours"], r["slo_minutes"], r["minutes"])
                       for r in load["runs"]), DEFAULT_SLO)


def _plot(found: Sweep, folder: Path, name: str, requests: int | None) -> None:
    """The load's curves as ``folder``/<load>.png (``--plots``)."""
    from gpuscale.sim.sweep_plot import plot_sweep

    png = folder / f"{_slug(name)}.png"
    title = name if requests is None else f"{name}: {requests} requests"
    plot_sweep(found, png, title, dpi=PLOT_DPI)
    _shrink(png)


def _shrink(png: Path) -> None:
    """256 colours (Pillow, which matplotlib brings): a quarter of the bytes, so one plot
    per load can live in docs/frontier/."""
    from PIL import Image

    with Image.open(png) as im:
        small = im.convert("RGB").quantize(colors=256, method=Image.Quantize.FASTOCTREE)
    small.save(png, optimize=True)


def _slug(name: str) -> str:
    return name.replace(" ", "-")


def pick_loads(todo: Sequence[Case], names: str) -> list[Case]:
    """The loads ``names`` (comma-separated, as printed with '-' for a space: the
    patterns' own names have '-' too) of ``todo``; an unknown name stops the bench
    (``SystemExit``) with the names it knows."""
    wanted = {_slug(w.strip()) for w in names.split(",")}
    unknown = wanted - {_slug(c.name) for c in todo}
    if unknown:
        sys.exit(f"--loads: no load {', '.join(sorted(unknown))}; the loads: "
                 + ", ".join(_slug(c.name) for c in todo))
    return [c for c in todo if _slug(c.name) in wanted]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="four loads, as bench_simulate's")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--loads", default="", help="comma-separated load names ('-' for ' ')")
    ap.add_argument("--rate-mode", choices=("place", "rotate"), default="place")
    ap.add_argument("--plots", type=Path, help="a directory for one PNG per load")
    ap.add_argument("--json", type=Path, help="every run of every load, as JSON")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a planner trigger key for every planner run")
    ap.add_argument("--from", dest="source", type=Path,
                    help="judge the runs a --json of an earlier run wrote (no simulation)")
    args = ap.parse_args()
    if args.plots is not None:
        from gpuscale.common.plotting import load_pyplot

        load_pyplot()  # refuse before the work, not after it
        args.plots.mkdir(parents=True, exist_ok=True)
    if args.source is not None:
        loads = json.loads(args.source.read_text())
        verdicts = [judge(name, load["tuned"], _read(load)) for name, load in loads.items()]
        if args.plots is not None:
            for name, load in loads.items():
                _plot(_read(load), args.plots, name, load.get("requests"))
        print(table(verdicts))
        print()
        print(tally(verdicts))
        return
    extra = dict(kv.split("=", 1) for kv in args.set)
    todo = cases(args.quick, args.rate_mode)
    if args.loads:
        todo = pick_loads(todo, args.loads)
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
          f"{sys.version.split()[0]}; {args.jobs} worker processes; trace rate mode "
          f"{args.rate_mode}; planner {extra or 'defaults'}", flush=True)
    t0 = time.perf_counter()
    verdicts, dump = [], {}
    for case in todo:
        t1 = time.perf_counter()
        requests = case.requests()
        duration = (requests[-1].arrival_s if requests else 0.0) + 300.0
        found = sweep(requests, duration, ServingParams(), keys=tuple(POLICIES),
                      jobs=args.jobs, planner_metadata=extra)
        verdicts.append(judge(case.name, case.tuned, found))
        dump[case.name] = {"tuned": case.tuned, "requests": len(requests),
                           **sweep_json(found)}
        if args.plots is not None:
            _plot(found, args.plots, case.name, len(requests))
        v = verdicts[-1]
        print(f"{case.name}: planner {v.planner.gpu_hours:.2f} / {v.planner.slo_minutes}; "
              f"{'on the frontier' if v.on_frontier else 'beaten'}; "
              f"{len(found.points)} runs in {time.perf_counter() - t1:.0f} s", flush=True)
    print()
    print(table(verdicts))
    print()
    print(tally(verdicts))
    print(f"\n{len(todo)} loads in {time.perf_counter() - t0:.0f} s")
    if args.json is not None:
        args.json.write_text(json.dumps(dump, indent=1))


if __name__ == "__main__":
    main()
