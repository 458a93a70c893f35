"""What the live demo shows: a screen redrawn in place on a terminal, or log lines when
the output is not a terminal, and the summary printed at the end."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import textwrap
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from gpuscale.demo.world import NAMESPACE, WORKLOAD, SimClock, World
from gpuscale.models.slo import SLO_TTFT_S
from gpuscale.scaler.core.planner import Plan
from gpuscale.scaler.core.selector import parse_selector
from gpuscale.scaler.core.trigger import parse_metadata
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.scaler.state.plan_book import PlanBook
from gpuscale.stream.records import PodRecord
from gpuscale.telemetry.model import Absent


@dataclass
class Decision:
    at: float  # simulated seconds since the demo began
    before: int
    after: int
    why: str
    wall: float = 0.0  # when it was made, wall seconds (time.time()); 0: not known

    def when(self) -> str:
        """Its simulated time, and the wall-clock time in UTC that ``gpuscale explain
        --at`` takes to look it up: "00:42:10 sim (03:41:07 UTC)"."""
        if not self.wall:
            return fmt_time(self.at)
        utc = time.strftime("%H:%M:%S", time.gmtime(round(self.wall)))
        return f"{fmt_time(self.at)} sim ({utc} UTC)"


@dataclass
class Status:
    """What the view shows; written by the controller."""

    metrics: list[tuple[str, float, float | None]] = field(default_factory=list)
    #   (metric name, target, value or None when the scaler refused)
    active: bool | None = None
    rpc_ms: float = 0.0
    error: str = ""
    decisions: deque[Decision] = field(default_factory=lambda: deque(maxlen=5))


def fmt_time(t: float) -> str:
    t = max(0, int(t))
    return f"{t // 3600:02d}:{t % 3600 // 60:02d}:{t % 60:02d}"


@dataclass(frozen=True, slots=True)
class Summary:
    duration: float
    gpu_hours: float
    slo_minutes: int
    minutes: int
    p95_ttft_s: float
    changes: int
    max_replicas: int
    profile: str = ""

    def lines(self) -> list[str]:
        """The run's own figures, each line within 80 columns."""
        return [
            f"simulated {fmt_time(self.duration)} with gpuscale ({self.profile}): "
            f"{self.gpu_hours:.2f} GPU-hours,",
            f"  SLO (time to first token <= {SLO_TTFT_S:g} s) missed in {self.slo_minutes} "
            f"of {self.minutes} minutes, p95 TTFT {self.p95_ttft_s:.2f} s,",
            f"  {self.changes} scaling changes, at most {self.max_replicas} replicas"]


class View:
    """A screen redrawn in place on a terminal, or log lines (one per decision and one per
    simulated minute) when the output is not a terminal."""

    def __init__(self, world: World, clock: SimClock, status: Status, fleet: FleetView,
                 address: str, tty: bool, out: Callable[[str], None],
                 plans: PlanBook | None = None, hint: str = "") -> None:
        """``hint``: a command that asks the scaler what KEDA gets (shown wrapped)."""
        self.world, self.clock, self.status, self.fleet = world, clock, status, fleet
        self.hint = hint
        self.hint_title = "what KEDA gets (paste into another terminal):"
        self.plans = plans
        self.address = address
        self.tty = tty
        self._out = out
        self._last_minute = -1
        self.max_seen = len(world.pods)
        self.log_lines: deque[str] = deque(maxlen=4)

    def decision(self, d: Decision) -> None:
        self.max_seen = max(self.max_seen, d.after)
        if not self.tty:
            self._out(f"{d.when()} replicas {d.before} -> {d.after}: {d.why}; "
                      f"{self._metrics_text()}")

    def _metrics_text(self) -> str:
        parts = [f"{name.removeprefix('gpuscale-')} "
                 f"{'UNAVAILABLE' if v is None else f'{v:.0f}'} (target {t:g}/pod)"
                 for name, t, v in self.status.metrics]
        return ", ".join(parts) or "no metric read yet"

    def plan_text(self) -> str:
        """The demo workload's plan and its terms, when the planner runs it."""
        if self.plans is None:
            return ""
        plan = dict(self.plans.plans()).get((NAMESPACE, WORKLOAD))
        problem = self.plans.problems().get((NAMESPACE, WORKLOAD))
        text = "" if plan is None else _plan_line(plan)
        return text + (f" [not updated: {problem[:120]}]" if problem else "")

    def _load(self) -> tuple[float, int]:
        w = self.world
        return len(w.arrivals) / 60.0, len(w.model.queue)

    async def run(self) -> None:
        while True:
            if self.tty:
                width = shutil.get_terminal_size((80, 24)).columns
                self._out("\x1b[H\x1b[2J" + "\n".join(self.screen(width)))
                await asyncio.sleep(0.25)
            else:
                minute = int(self.world.now // 60)
                if minute != self._last_minute:
                    self._last_minute = minute
                    rate, queue = self._load()
                    plan = self.plan_text()
                    self._out(f"{fmt_time(self.world.now)} load {rate:.1f} req/s, queue "
                              f"{queue}, replicas {len(self.world.pods)} "
                              f"({self.world.ready_count()} ready), GPU-hours "
                              f"{self.world.model.gpu_seconds / 3600:.2f}"
                              f"{'; ' + plan if plan else ''}")
                await asyncio.sleep(0.1)

    def screen(self, width: int = 80) -> list[str]:
        """The terminal screen, each line cut to ``width`` (a live view must not wrap; the
        log lines off a terminal carry everything), and the hint wrapped at spaces - in
        its JSON they fall between tokens, so the lines still paste as one command."""
        lines = [line if len(line) <= width else line[:width - 1] + "…"
                 for line in self._screen()]
        if self.hint:
            lines += ["", self.hint_title,
                      *textwrap.wrap(self.hint, width=max(40, width - 2),
                                     initial_indent="  ", subsequent_indent="    ",
                                     break_long_words=False, break_on_hyphens=False)]
        return lines

    def _screen(self) -> list[str]:
        w, s = self.world, self.status
        rate, queue = self._load()
        ready = w.ready_count()
        lines = [
            f"gpuscale demo - closed loop   simulated {fmt_time(w.now)} / "
            f"{fmt_time(w.cfg.duration)}   x{self.clock.speed:g}   Ctrl-C stops",
            "",
            f"load      {rate:7.1f} requests/s (last minute)   queued {queue}",
            f"replicas  {len(w.pods):3d} ({ready} ready, {len(w.pods) - ready} starting)   "
            f"min {w.cfg.min_replicas} max {w.cfg.max_replicas}   GPU-hours "
            f"{w.model.gpu_seconds / 3600:.2f}",
            f"scaler    {self.address} profile {w.cfg.profile}, {s.rpc_ms:.1f} ms, "
            f"active {s.active}",
            f"          {self._metrics_text()}",
            f"try       {explain_command(w.cfg.min_replicas, w.cfg.max_replicas)} \\",
            f"            --scaler {self.address}",
            f"          gpuscale top --scaler {self.address}",
            *(["          (the Deployment the HPA reads; its reasons are under "
               "decisions)"] if w.cfg.hpa else []),
        ]
        if s.error:
            lines.append(f"          {s.error[:100]}")
        plan = self.plan_text()
        if plan:
            lines.append(f"planner   {plan}")
        lines.append("decisions")
        lines += [f"  {d.when()} {d.before} -> {d.after}: {d.why[:90]}"
                  for d in list(s.decisions)[-3:]] or ["  none yet"]
        lines += ["", "pods, as the scaler sees them (GPU from the agents' NVML-style "
                  "readings, requests and KV cache from the engines)",
                  f"  {'pod':<18}{'node':<12}{'GPU util':>9}{'requests':>10}"
                  f"{'KV cache':>10}  state"]
        records: dict[str, PodRecord] = {
            r.name: r for r in self.fleet.select(NAMESPACE, parse_selector(f"app={WORKLOAD}"))}
        for p in w.pods[:16]:
            r = records.get(p.name)
            sig = r.signals if r is not None else {}
            lines.append(f"  {p.name:<18}{w.base[p.node].name:<12}"
                         f"{_num(sig.get('gpu-utilization'), '%'):>9}"
                         f"{_num(sig.get('vllm-requests'), ''):>10}"
                         f"{_num(sig.get('vllm-kv-cache'), '%'):>10}  "
                         f"{'ready' if w.is_ready(p) else 'starting'}")
        if len(w.pods) > 16:
            lines.append(f"  ... and {len(w.pods) - 16} more")
        if self.log_lines:
            lines += ["", "log", *(f"  {line[:110]}" for line in self.log_lines)]
        return lines


def _num(v: object, unit: str) -> str:
    if isinstance(v, Absent):
        return v.value
    if isinstance(v, int | float):
        return f"{v:.0f}{' ' + unit if unit else ''}"
    return "-"


class ViewLog(logging.Handler):
    def __init__(self, view: View) -> None:
        super().__init__(logging.WARNING)
        self._view = view

    def emit(self, record: logging.LogRecord) -> None:
        self._view.log_lines.append(self.format(record))


HIDE_CURSOR, SHOW_CURSOR = "\x1b[?25l", "\x1b[?25h"


def _plan_line(plan: Plan) -> str:
    """How the plan came about, in replicas (the terms of scaler.planner)."""
    return (f"plan {plan.replicas} (held; now ceil(max(steady {plan.steady:.1f}, burst "
            f"{plan.burst:.1f}, batch {plan.concurrency:.1f}, kv {plan.kv:.1f}) + backlog "
            f"{plan.backlog:.1f}) = {plan.unheld}); {plan.ready} ready + {plan.starting} "
            f"starting{', warming up' if plan.warming else ''}")


def explain_command(min_replicas: int, max_replicas: int) -> str:
    """``gpuscale explain`` for the demo's workload with its bounds: its scaler has no
    ScaledObject watch to learn them from (without them explain assumes KEDA's 0 and
    100); the caller adds ``--scaler``."""
    return (f"gpuscale explain {NAMESPACE}/{WORKLOAD} --min-replicas {min_replicas} "
            f"--max-replicas {max_replicas}")


def grpcurl_hint(address: str, metadata: dict[str, str]) -> str:
    """A command that asks the demo's scaler for the value KEDA gets (GetMetrics, the
    trigger's first metric), as printed: ``gpuscale keda``, grpcurl's call with what
    gpuscale installs (grpcurl itself: ``grpcurl -plaintext -d JSON ADDRESS
    externalscaler.ExternalScaler/GetMetrics``, docs/keda.md), the ScaledObject reference
    with the trigger's real metadata, in single quotes (the JSON has none of its own)."""
    trigger = parse_metadata(metadata)
    request = {"scaledObjectRef": {"name": WORKLOAD, "namespace": NAMESPACE,
                                   "scalerMetadata": metadata},
               "metricName": trigger.metric_name(trigger.targets[0])}
    return f"gpuscale keda GetMetrics '{json.dumps(request)}' --scaler {address}"
