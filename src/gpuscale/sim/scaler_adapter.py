"""The simulator through the scaler's own answer function (``scaler.answers``).

Every simulated step the replicas' telemetry becomes PodRecords in a FleetView (one node,
fed in process: complete by construction), and KEDA's and the HPA's models read what
``Answers.value`` gives for the trigger - the very code that answers GetMetrics - and what
``Answers.active`` gives - IsActive's, by the one activity rule - so what ``gpuscale
simulate`` measures is what ships. A trigger scaled to zero wakes only as the real one
does: on a declared demand source (``GATEWAY``: the serving model's queue of requests
waiting for a replica, as the live demo's gateway serves it), not on any queue.

The planner (profile vllm-planner): every simulated second, each Ready replica's engine
counters (prompt and generated tokens, finished requests) become per-pod rates over the
last second, as the agent computes them from vLLM's counters; with its running and waiting
requests and KV-cache use they are the pods' signals, and the plan book observes them once
a second as the scaler's plan loop does. KEDA and the HPA read ``planned x targetValue`` as
an External AverageValue metric when they poll, and hold (UNAVAILABLE) when there is no
plan.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from gpuscale.common.errors import ConfigError, Unavailable
from gpuscale.models.hpa import Metric, MetricSource, TargetType
from gpuscale.models.planner_behavior import planner_rules
from gpuscale.models.serving import ServingModel, ServingParams, planner_metadata
from gpuscale.scaler.answers import Answers, DemandCheck, Workload
from gpuscale.scaler.core.planner import Plan
from gpuscale.scaler.core.selector import Selector, parse_selector
from gpuscale.scaler.core.trigger import parse_metadata
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.scaler.state.plan_book import PlanBook
from gpuscale.stream.records import PodRecord
from gpuscale.telemetry.model import Reading

_SELECTOR = parse_selector("app=llm")
NAMESPACE, NAME, NODE = "sim", "llm", "node"
GATEWAY = "gateway"  # the demand source a trigger may name: the serving model's queue


class _OneNode:
    """The simulation's roster: its one node is a gap until it has reported (as an agent
    that has not reported is to the scaler), so an empty view never answers 0."""

    reported = False

    def problems(self, namespace: str, selector: Selector,
                 records: Sequence[PodRecord]) -> list[str]:
        return [] if self.reported else ["the simulated node has not reported yet"]


class SimScaler:
    """A fleet view on the simulation's clock and the answer function over it."""

    def __init__(self, metadata: Mapping[str, str],
                 demand: DemandCheck | None = None) -> None:
        """``demand``: the demand sources (default: ``GATEWAY``, the queue ``report``
        was last given)."""
        self.trigger = parse_metadata({"podSelector": _SELECTOR.text, **metadata})
        self.now = 0.0
        self.queue = 0  # requests waiting for a replica, as last reported
        self.fleet = FleetView(monotonic=lambda: self.now)
        self.roster = _OneNode()
        self.started: tuple[tuple[str, float], ...] = ()  # the pod watch's start-ups
        # Asked at every HPA sync and KEDA poll: a planner is never idle long enough to go.
        self.answers = Answers(self.fleet, self.roster, plans=PlanBook(idle_s=math.inf),
                               demand=demand or self._gateway, startups=self)
        self.workload = Workload(NAMESPACE, NAME, self.trigger)
        self.answers.check(self.workload)  # a demand source not declared: ConfigError

    def _gateway(self, source: str) -> bool:
        if source != GATEWAY:
            raise ConfigError(f"demandSource: {source!r}: the simulator declares only "
                              f"{GATEWAY!r} (the requests waiting for a replica)")
        return self.queue > 0

    def startups(self, namespace: str, selector: Selector) -> tuple[tuple[str, float], ...]:
        """The Ready replicas' creation to Ready, as the scaler's pod watch reads them."""
        return self.started

    def report(self, now: float, signals: list[tuple[bool, dict[str, Reading]]],
               numbers: list[int] | None = None, queue: int | None = None) -> None:
        """This step's replicas: (Ready, signals) each; ``numbers`` name their pods (a
        replica keeps its name while others come and go), else their positions;
        ``queue``: the requests waiting for a replica (None: as before)."""
        self.now = now
        if queue is not None:
            self.queue = queue
        self.roster.reported = True
        names = numbers if numbers is not None else range(len(signals))
        self.fleet.update_node(NODE, [
            PodRecord(NAMESPACE, f"{NAME}-{i}", NODE, {"app": NAME}, None, ready, values, now)
            for i, (ready, values) in zip(names, signals, strict=True)])

    def metrics(self, now: float) -> list[Metric]:
        """Each target's value as KEDA would get it (None: UNAVAILABLE, the HPA holds)."""
        self.now = now
        out = []
        for t in self.trigger.targets:
            got = self.answers.value(self.workload, t)
            value = None if isinstance(got, Unavailable) else got.value
            out.append(Metric(MetricSource.EXTERNAL, TargetType.AVERAGE_VALUE, t.target,
                              value))
        return out

    def active(self, now: float) -> bool | None:
        """IsActive as KEDA would get it (None: UNAVAILABLE): ``Answers.active``."""
        self.now = now
        got = self.answers.active(self.workload)
        return None if isinstance(got, Unavailable) else got


class ProfileSignal:
    """A gpuscale profile as the HPA's signal (``__call__``: the replicas' signals, summed
    by the scaler's answer function) and KEDA's IsActive (``active``), at the same
    instant."""

    def __init__(self, metadata: Mapping[str, str]) -> None:
        self.scaler = SimScaler(metadata)

    def __call__(self, model: ServingModel, now: float) -> list[Metric]:
        self.scaler.report(now, [
            (s.ready, {"gpu-utilization": s.duty_cycle, "vllm-waiting": s.waiting,
                       "vllm-running": float(s.running), "vllm-requests": s.running + s.waiting,
                       "vllm-kv-cache": s.kv_cache} if s.ready else {})
            for s in model.signals(now)], queue=len(model.queue))
        return self.scaler.metrics(now)

    def active(self, now: float) -> bool | None:
        return self.scaler.active(now)


def profile_signal(metadata: dict[str, str], min_replicas: int = 1) -> ProfileSignal:
    """A gpuscale profile as the HPA's signal and KEDA's IsActive; ``min_replicas`` 0
    declares the trigger's ``demandSource: gateway`` (what wakes it at zero, as the live
    demo's trigger does) unless it names one."""
    return ProfileSignal(wakes(metadata, min_replicas))


def wakes(metadata: Mapping[str, str], min_replicas: int) -> dict[str, str]:
    """``metadata`` with the gateway's queue as its demand source when the workload may
    be at zero replicas (where no pod shows the load)."""
    if min_replicas == 0 and "demandSource" not in metadata:
        return {**metadata, "demandSource": GATEWAY}
    return dict(metadata)


class PlannerPolicy:
    """A Signal (``__call__``) and a per-second observer (``tick``) for ``run_policy``."""

    def __init__(self, metadata: Mapping[str, str]) -> None:
        self._sim = SimScaler({"profile": "vllm-planner", **metadata})
        assert self._sim.trigger.planner is not None
        self.target = self._sim.trigger.targets[0].target
        # replica (by identity) -> (time, prompt tokens, generated tokens, finished)
        self._counters: dict[int, tuple[float, float, float, float]] = {}
        # (minute, steady, burst, kv) at each minute's first plan: the terms, for a plot
        self.terms: list[tuple[int, float, float, float]] = []

    @property
    def plans(self) -> PlanBook:
        return self._sim.answers.plans

    def plan(self, now: float) -> Plan | Unavailable:
        """The plan KEDA would get now (read only)."""
        got = self.plans.peek(self._sim.workload.plan_key, now)
        return Unavailable("no planner yet") if got is None else got

    def tick(self, model: ServingModel, now: float) -> None:
        replicas: list[tuple[bool, dict[str, Reading]]] = []
        seen: dict[int, tuple[float, float, float, float]] = {}
        for rep, s in zip(model.replicas, model.signals(now), strict=True):
            signals: dict[str, Reading] = {}
            if s.ready:
                counters = (now, s.prompt_tokens_total, s.generation_tokens_total,
                            s.finished_total)
                seen[id(rep)] = counters
                before = self._counters.get(id(rep))
                signals = {"vllm-waiting": s.waiting, "vllm-running": float(s.running),
                           "vllm-kv-cache": s.kv_cache}
                if before is not None and now > before[0]:
                    # (the first scrape of a counter gives no rate: like the scaler, the
                    # observation then fails and the planner keeps its last plan)
                    dt = now - before[0]
                    signals.update({
                        "vllm-prompt-tps": (counters[1] - before[1]) / dt,
                        "vllm-generation-tps": (counters[2] - before[2]) / dt,
                        "vllm-finished-rate": (counters[3] - before[3]) / dt})
            replicas.append((s.ready, signals))
        self._counters = seen
        sim = self._sim
        # A replica running when the simulation began started once too: its own draw.
        sim.started = tuple(
            (f"{NAME}-{rep.number}", rep.ready_at - rep.created if rep.ready_at > rep.created
             else model.p.cold_start(rep.number))
            for rep in model.replicas if now >= rep.ready_at)
        sim.report(now, replicas, [rep.number for rep in model.replicas], len(model.queue))
        if sim.workload.plan_key in self.plans:
            self.plans.tick(now)  # the scaler's plan loop, once a planner second
        else:
            sim.metrics(now)  # the first ask creates the planner and observes at once
        minute = int(now // 60)
        if not self.terms or self.terms[-1][0] != minute:
            plan = self.plan(now)
            if not isinstance(plan, Unavailable):
                self.terms.append((minute, plan.steady, plan.burst, plan.kv))

    def __call__(self, model: ServingModel, now: float) -> list[Metric]:
        return self._sim.metrics(now)

    def active(self, now: float) -> bool | None:
        """IsActive as KEDA would get it (None: UNAVAILABLE)."""
        return self._sim.active(now)


def planner_policy(params: ServingParams, slo_s: float = 2.0, measure_startup: bool = False,
                   **metadata: str) -> dict[str, Any]:
    """``run_policy`` keyword arguments for the planner as docs/planner.md configures it: its
    value as the HPA's signal, the per-second observation through the decider hook (which
    never decides), and the HPA's behavior for the planner (``models.planner_behavior``:
    no scale-down window, tolerance 0).
    ``measure_startup``: no ``startupSeconds``; the planner measures the replicas'.
    ``metadata`` overrides those keys; with ``queueDelaySeconds`` (the objective a queue
    delay), ``slo_s`` is not given as ``ttftSeconds``."""
    base = planner_metadata(params, slo_s, measure_startup)
    if "queueDelaySeconds" in metadata:
        del base["ttftSeconds"]
    policy = PlannerPolicy({**base, **metadata})
    up, down = planner_rules()

    def tick(model: ServingModel, now: float, replicas: int) -> int | None:
        policy.tick(model, now)
        return None  # the HPA decides, on the planner's value
    return {"signal": policy, "decider": tick,
            "scale_up": up, "scale_down": down}
