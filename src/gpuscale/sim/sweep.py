"""Every policy at several settings of its own knob over one load: the frontier of
(GPU-hours, SLO minutes) it spans, and the planner's curve against the best baseline's -
what ``gpuscale simulate --sweep`` prints (and ``--plot`` draws), what a team reads before
it installs anything.

Knobs (``KNOBS``; each policy's documented default among its settings):

- the planner: its ``utilization`` trigger key (the busy fraction its steady term aims at);
- Knative's KPA: its target concurrency per pod (container-concurrency-target-default x
  target-percentage); AIBrix's KPA and APA: their KV-cache ``targetValue`` (percent);
- the queue model: the time-to-first-token budget it sizes for (seconds);
- static provisioning: the count, around the peak of the work (``needed_replicas``' most,
  from 3 below it to 1 above it).

Every other policy runs once, at its default (its point still counts for the frontier).
Each run is ``run_policy`` as ``gpuscale simulate`` runs it (``sim.compare.policy_runs``:
the same opening fleet, floor and objective); runs are independent, so ``jobs`` > 1 runs
them in worker processes.

A curve is the runs no other run of the same policy beats: none with no more SLO minutes
for fewer GPU-hours, or fewer minutes for no more (``pareto``). The frontier is that over
every run of every policy. The planner against the baselines: at each number of SLO
minutes either reaches, the fewest GPU-hours each gets with no more minutes than that.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from gpuscale.models.serving import ServingParams, needed_replicas
from gpuscale.models.slo import DEFAULT_SLO, SloSpec
from gpuscale.sim.compare import POLICIES, opening, policy_runs
from gpuscale.sim.queue_model import QueueModel
from gpuscale.sim.simulate import run_policy
from gpuscale.sim.window_autoscalers import KV_TARGET, Apa, ApaSpec, Kpa, KpaSpec, aibrix_kpa
from gpuscale.traffic.trace import TraceRequest

PLANNER = "planner"
STATIC = "static"


@dataclass(frozen=True, slots=True)
class Knob:
    """What a policy's sweep moves, its documented default and the settings tried."""

    name: str
    default: float
    settings: tuple[float, ...]


KNOBS: dict[str, Knob] = {
    PLANNER: Knob("utilization", 0.85, (0.6, 0.7, 0.8, 0.85, 0.9, 1.0)),
    "knative-kpa": Knob("target concurrency", KpaSpec().target, (35.0, 50.0, 70.0, 100.0,
                                                                  140.0)),
    "aibrix-kpa": Knob("KV target %", KV_TARGET, (30.0, 40.0, 50.0, 60.0, 70.0, 80.0)),
    "aibrix-apa": Knob("KV target %", ApaSpec().target, (30.0, 40.0, 50.0, 60.0, 70.0, 80.0)),
    "queue-model": Knob("TTFT budget s", DEFAULT_SLO.target_s, (1.0, 1.5, 2.0, 3.0, 4.0)),
}
STATIC_BELOW, STATIC_ABOVE = 3, 1  # static counts tried around the peak of the work

Progress = Callable[[str, float], None]  # (what ran last, fraction done)


@dataclass(frozen=True, slots=True)
class SweepPoint:
    """One run: a policy (``key`` of ``POLICIES``) at one setting of its knob."""

    key: str
    policy: str
    knob: str  # "default" for a policy run only at its default
    setting: float | None
    default: bool  # the policy's documented default (static has none)
    gpu_hours: float
    slo_minutes: int
    minutes: int

    def label(self) -> str:
        return "default" if self.setting is None else f"{self.knob} {self.setting:g}"


@dataclass(frozen=True, slots=True)
class LevelRow:
    """At ``slo_minutes``: the fewest GPU-hours of the planner's runs and of the other
    policies' runs missing no more minutes (None: none of them does)."""

    slo_minutes: int
    planner: SweepPoint | None
    baseline: SweepPoint | None

    @property
    def gap(self) -> float | None:
        """The planner's GPU-hours over the best baseline's, less one."""
        if self.planner is None or self.baseline is None:
            return None
        base = self.baseline.gpu_hours
        return self.planner.gpu_hours / base - 1.0 if base > 0 else math.inf


@dataclass(frozen=True, slots=True)
class Sweep:
    points: tuple[SweepPoint, ...]
    slo: SloSpec

    def curve(self, key: str) -> list[SweepPoint]:
        return pareto([p for p in self.points if p.key == key])

    @property
    def frontier(self) -> list[SweepPoint]:
        return pareto(self.points)

    def levels(self) -> list[LevelRow]:
        """The planner against the best other policy at each SLO-minutes level reached."""
        mine = [p for p in self.points if p.key == PLANNER]
        rest = [p for p in self.points if p.key != PLANNER]
        out = []
        for level in sorted({p.slo_minutes for p in self.points}):
            out.append(LevelRow(level, _cheapest(mine, level), _cheapest(rest, level)))
        return out


def pareto(points: Sequence[SweepPoint]) -> list[SweepPoint]:
    """The points no other beats (no more SLO minutes for fewer GPU-hours, or fewer
    minutes for no more), cheapest first; of equal points, the first."""
    out: list[SweepPoint] = []
    for p in sorted(points, key=lambda p: (p.gpu_hours, p.slo_minutes)):
        if not out or p.slo_minutes < out[-1].slo_minutes:
            out.append(p)
    return out


def _cheapest(points: Sequence[SweepPoint], level: int) -> SweepPoint | None:
    fits = [p for p in points if p.slo_minutes <= level]
    return min(fits, key=lambda p: (p.gpu_hours, p.slo_minutes)) if fits else None


Task = tuple[str, float | None]  # (policy key, setting; None: its default)


def tasks(requests: Sequence[TraceRequest], duration: float, params: ServingParams,
          keys: Sequence[str] = tuple(POLICIES)) -> list[Task]:
    """Every run of the sweep, for the policies in ``keys``."""
    out: list[Task] = []
    for key in keys:
        if key in KNOBS:
            out.extend((key, s) for s in KNOBS[key].settings)
        elif key == STATIC:
            peak = max(needed_replicas(requests, duration, params) or [1])
            out.extend((key, float(n)) for n in range(max(1, peak - STATIC_BELOW),
                                                      peak + STATIC_ABOVE + 1))
        elif key in POLICIES:
            out.append((key, None))
        else:
            raise ValueError(f"--policies: {key!r} is not a policy a sweep runs")
    return out


@dataclass(frozen=True, slots=True)
class _Context:
    requests: Sequence[TraceRequest]
    duration: float
    params: ServingParams
    slo: SloSpec
    min_replicas: int
    start: int
    planner_metadata: tuple[tuple[str, str], ...] = ()  # trigger keys on every planner run


# The load every task of this process runs on: set once per worker (its initializer), so
# a load of 100,000s of requests crosses to each worker once, not with every task.
_CONTEXT: dict[str, _Context] = {}


def _set_context(context: _Context) -> None:
    _CONTEXT["load"] = context


def run_task(task: Task) -> SweepPoint:
    """One run of the sweep on this process's load (``_set_context``)."""
    c = _CONTEXT["load"]
    key, setting = task
    if key == STATIC:
        n = int(setting or 1)
        result = run_policy(f"static at {n}", c.requests, c.duration, c.params, static=n,
                            slo=c.slo)
        return SweepPoint(key, "static", "count", float(n), False,
                          result.gpu_hours, result.slo_violation_minutes, result.minutes)
    extra = dict(c.planner_metadata) if key == PLANNER else {}
    if key == PLANNER and setting is not None:
        extra["utilization"] = f"{setting:g}"
    kwargs = dict(dict(policy_runs(c.params, c.requests, c.slo, c.min_replicas, c.start,
                                   **extra))[key])
    name = kwargs.pop("name")
    if setting is not None and key != PLANNER:
        kwargs["decider"] = _decider(key, setting, c.params)
    result = run_policy(name, c.requests, c.duration, c.params, slo=c.slo, **kwargs)
    knob = KNOBS.get(key)
    return SweepPoint(key, name, knob.name if knob else "default", setting,
                      knob is None or setting == knob.default, result.gpu_hours,
                      result.slo_violation_minutes, result.minutes)


def _decider(key: str, setting: float, params: ServingParams) -> Any:
    if key == "knative-kpa":
        return Kpa(KpaSpec(target=setting))
    if key == "aibrix-kpa":
        return aibrix_kpa(setting)
    if key == "aibrix-apa":
        return Apa(ApaSpec(target=setting))
    if key == "queue-model":
        return QueueModel(params, slo_s=setting)
    raise ValueError(f"no knob for {key!r}")


def sweep(requests: Sequence[TraceRequest], duration: float,
          params: ServingParams | None = None, slo: SloSpec = DEFAULT_SLO,
          min_replicas: int = 1, keys: Sequence[str] = tuple(POLICIES), jobs: int = 1,
          progress: Progress | None = None,
          planner_metadata: Mapping[str, str] | None = None) -> Sweep:
    """Every task of ``tasks`` on this load, ``jobs`` at a time (1: in this process);
    ``planner_metadata``: trigger keys given to every planner run (its knob still swept)."""
    params = params or ServingParams()
    todo = tasks(requests, duration, params, keys)
    context = _Context(requests, duration, params, slo, min_replicas,
                       opening(requests, duration, params),
                       tuple(sorted((planner_metadata or {}).items())))
    points: list[SweepPoint] = []

    def done(point: SweepPoint) -> None:
        points.append(point)
        if progress is not None:
            progress(f"{point.policy} {point.label()}", len(points) / len(todo))

    if jobs <= 1:
        _set_context(context)
        for task in todo:
            done(run_task(task))
    else:
        with ProcessPoolExecutor(max_workers=jobs, initializer=_set_context,
                                 initargs=(context,)) as pool:
            for point in pool.map(run_task, todo):
                done(point)
    order = {t: i for i, t in enumerate(todo)}
    points.sort(key=lambda p: order[(p.key, p.setting)])
    return Sweep(tuple(points), slo)


def format_sweep(s: Sweep) -> str:
    """The table ``gpuscale simulate --sweep`` prints: every run by policy (d: its default,
    c: on its own curve, *: on the frontier of every run), then the planner against the
    best other policy at each SLO-minutes level."""
    frontier = {id(p) for p in s.frontier}
    head = f"{'policy':<40}{'setting':<24}{'GPU-h':>7}{'SLO min':>10}  marks"
    lines = [head, "-" * len(head)]
    for key in dict.fromkeys(p.key for p in s.points):
        curve = {id(p) for p in s.curve(key)}
        for p in (q for q in s.points if q.key == key):
            marks = ("d" if p.default else "") + ("c" if id(p) in curve else "") + (
                "*" if id(p) in frontier else "")
            lines.append(f"{p.policy[:39]:<40}{p.label()[:23]:<24}{p.gpu_hours:>7.2f}"
                         f"{p.slo_minutes:>5}/{p.minutes:<4}  {marks}")
    lines.append("d: the policy's default; c: on its own curve; *: on the frontier (no run "
                 "of any policy misses no more minutes for fewer GPU-hours)")
    lines.append("")
    lines.append("The planner's curve against the best other policy's (the fewest GPU-hours "
                 "at no more SLO minutes):")
    head = f"{'SLO min <=':>10}  {'planner':<32}{'best other policy':<56}{'planner vs':>10}"
    lines += [head, "-" * len(head)]
    for row in s.levels():
        mine = "-" if row.planner is None else (f"{row.planner.gpu_hours:.2f} "
                                                f"({row.planner.label()})")
        base = "-" if row.baseline is None else (
            f"{row.baseline.gpu_hours:.2f} ({row.baseline.policy}, {row.baseline.label()})")
        gap = row.gap
        vs = "-" if gap is None else "inf" if math.isinf(gap) else f"{gap:+.0%}"
        lines.append(f"{row.slo_minutes:>10}  {mine[:31]:<32}{base[:55]:<56}{vs:>10}")
    return "\n".join(lines)


def sweep_json(s: Sweep) -> dict[str, Any]:
    """Every run, each policy's curve, the frontier and the planner's comparison."""
    def point(p: SweepPoint) -> dict[str, Any]:
        return {"key": p.key, "policy": p.policy, "knob": p.knob, "setting": p.setting,
                "default": p.default, "gpu_hours": p.gpu_hours,
                "slo_minutes": p.slo_minutes, "minutes": p.minutes}

    keys = dict.fromkeys(p.key for p in s.points)
    return {
        "slo": s.slo.describe(),
        "runs": [point(p) for p in s.points],
        "curves": {k: [point(p) for p in s.curve(k)] for k in keys},
        "frontier": [point(p) for p in s.frontier],
        "planner_vs_best_other": [
            {"slo_minutes": r.slo_minutes,
             "planner": None if r.planner is None else point(r.planner),
             "best_other": None if r.baseline is None else point(r.baseline),
             "gap": r.gap} for r in s.levels()],
    }
