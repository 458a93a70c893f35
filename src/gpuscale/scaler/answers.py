"""The one place a workload's value is computed.

KEDA's ExternalScaler (GetMetrics, IsActive, StreamIsActive), the custom metrics API, the
history behind ``gpuscale explain`` and ``top``, and the simulator all ask here, so what a
person is shown is what KEDA was given, and what the simulator measures is what ships.

A ``Workload`` is what is asked about: a ScaledObject (or, for the metrics API, a
Deployment or StatefulSet) with its parsed trigger, and the pods' selector when the caller
knows it (else the trigger's ``podSelector``, else the ScaledObject's scale target through
the resolver). ``Answers.value`` gives a ``Value`` with the pods and plan that made it, or
``Unavailable`` with a reason a person can act on:

- the pods are the fleet view's records of the selection; the roster names the running
  pods (and agents) that have not reported; any gap, or a Ready pod whose reading is
  absent, stale or implausible, makes the answer Unavailable (``core.aggregate``);
- a planned trigger's value is its planner's replicas x target; the planner is created on
  the first ask and observed every planner second by the plan book's loop. Readers that
  must not keep a planner alive (the operator tools) peek instead of asking.

Input that cannot be used (no selector where the scaler cannot resolve one, an unknown
demand source) raises ConfigError; more planners than the scaler keeps raises Overloaded.
Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from gpuscale.common.errors import ConfigError, DataUnavailable, Unavailable
from gpuscale.scaler.core.aggregate import evaluate
from gpuscale.scaler.core.planner import Observation, Plan
from gpuscale.scaler.core.profiles import PLANNED, Target
from gpuscale.scaler.core.selector import Selector
from gpuscale.scaler.core.trigger import TriggerConfig
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.scaler.state.plan_book import PlanBook, observe
from gpuscale.stream.records import PodRecord

KEDA = "keda"  # the plan book's keys of planners KEDA's triggers created

# demand source name -> pending work? Raises DataUnavailable when the source cannot tell
# now, ConfigError when no such source is declared.
DemandCheck = Callable[[str], bool]


class Roster(Protocol):
    def problems(self, namespace: str, selector: Selector,
                 records: Sequence[PodRecord]) -> list[str]:
        """Why the workload's records may not be all of its pods ([] when they are)."""
        ...


class Startups(Protocol):
    def startups(self, namespace: str, selector: Selector) -> tuple[tuple[str, float], ...]:
        """(pod, seconds from its creation to its first Ready) of the selected pods whose
        start-up is known (the planner's measured start-up)."""
        ...


class Resolver(Protocol):
    def resolve(self, namespace: str, name: str) -> Selector | Unavailable:
        """The pod selector of ScaledObject ``namespace/name``'s scale target."""
        ...


class Plans(Enum):
    ASK = "ask"  # create the planner on the first ask and keep it alive (KEDA, the HPA)
    PEEK = "peek"  # read the plan if a planner exists; create nothing (operator tools)


@dataclass(frozen=True, slots=True)
class Workload:
    namespace: str
    name: str  # the ScaledObject's (KEDA), or "Kind/name" (the metrics API's objects)
    trigger: TriggerConfig
    selector: Selector | None = None  # None: the trigger's podSelector, else resolved
    source: str = KEDA  # who asks: planners of different askers are kept apart

    @property
    def plan_key(self) -> Hashable:
        selector = self.selector or self.trigger.selector
        return (self.source, self.namespace, self.name,
                selector.text if selector is not None else "", self.trigger)


@dataclass(frozen=True, slots=True)
class Selection:
    """The workload's pods as the fleet view has them, and the roster's gaps (read-only:
    the fleet view hands out a fresh list per selection, kept as it is)."""

    pods: Sequence[PodRecord]
    gaps: Sequence[str] = ()
    selector: Selector | None = None  # whose pods they are


@dataclass(frozen=True, slots=True)
class Value:
    """An OK answer: never smaller than what the workload's pods really use."""

    value: float  # what KEDA (or the HPA) gets, in the target's unit
    target: Target
    pods: Sequence[PodRecord]  # the selection it was computed over
    counted: int = 0  # pods whose reading was summed
    starting: int = 0  # pods left out: not Ready and no data yet
    ready: int = 0  # counted pods that are Ready
    plan: Plan | None = None  # a planned trigger's plan (its terms)


class Answers:
    """The scaler's inputs, read from memory: the fleet view, the roster of pods that must
    have reported, the ScaledObject resolver, the plan book, the demand sources and the
    pods' measured start-ups."""

    def __init__(self, fleet: FleetView, roster: Roster | None = None,
                 resolver: Resolver | None = None, plans: PlanBook | None = None,
                 demand: DemandCheck | None = None, startups: Startups | None = None) -> None:
        """``roster``: None only where the fleet view is complete by construction (fed in
        the same process: the simulator, tests). ``resolver``: None where the scaler has
        no Kubernetes API (a trigger must then name its podSelector). ``startups``: None
        where nothing watches the pods (planners then use ``startupSeconds`` or the
        default)."""
        self.fleet = fleet
        self.roster = roster
        self.resolver = resolver
        self.plans = plans if plans is not None else PlanBook()
        self.demand = demand
        self.startups = startups

    def check(self, workload: Workload) -> None:
        """Whether this scaler can answer the trigger at all (before any data): ConfigError
        naming the key when it cannot (KEDA gets INVALID_ARGUMENT, not UNAVAILABLE)."""
        trigger = workload.trigger
        if workload.selector is None and trigger.selector is None and self.resolver is None:
            raise ConfigError("podSelector: required (label selector of the workload's pods, "
                              "e.g. app=vllm); resolving scaleTargetRef through the API is "
                              "not enabled in this scaler")
        if trigger.demand_source:
            if self.demand is None:
                raise ConfigError("demandSource: this scaler has no demand sources configured")
            with suppress(DataUnavailable):  # declared; it just cannot tell now
                self.demand(trigger.demand_source)

    # -- the pods ------------------------------------------------------------------------

    def selector(self, workload: Workload) -> Selector | Unavailable:
        """Whose pods: the caller's, the trigger's podSelector, or the scale target's."""
        selector = workload.selector or workload.trigger.selector
        if selector is not None:
            return selector
        self.check(workload)  # no resolver: ConfigError
        assert self.resolver is not None
        resolved = self.resolver.resolve(workload.namespace, workload.name)
        if isinstance(resolved, Unavailable):
            return Unavailable(f"scale target: {resolved.reason}")
        return resolved

    def selection(self, workload: Workload) -> Selection | Unavailable:
        """The workload's pods' latest records, and the roster's gaps."""
        selector = self.selector(workload)
        if isinstance(selector, Unavailable):
            return selector
        records = self.fleet.select(workload.namespace, selector)
        gaps = ([] if self.roster is None else
                self.roster.problems(workload.namespace, selector, records))
        return Selection(records, gaps, selector)

    # -- the value -----------------------------------------------------------------------

    def value(self, workload: Workload, target: Target, plans: Plans = Plans.ASK,
              selection: Selection | Unavailable | None = None) -> Value | Unavailable:
        """What the workload's ``target`` gets now. ``selection``: the pods, when the
        caller has them already (one selection for several targets, or a subset of it)."""
        if target.signal == PLANNED and workload.trigger.planner is not None:
            return self._planned(workload, target, plans, selection)
        if selection is None:
            selection = self.selection(workload)
        if isinstance(selection, Unavailable):
            return selection
        try:
            got = evaluate(self.fleet, selection.pods, target,
                           workload.trigger.value_mode, selection.gaps)
        except DataUnavailable as exc:
            return Unavailable(str(exc))
        return Value(got.value, target, selection.pods, got.pods, got.starting, got.ready)

    def _planned(self, workload: Workload, target: Target, plans: Plans,
                 selection: Selection | Unavailable | None) -> Value | Unavailable:
        config = workload.trigger.planner
        assert config is not None
        now = self.fleet.now()
        plan: Plan | Unavailable | None
        if plans is Plans.PEEK:
            plan = self.plans.peek(workload.plan_key, now)
            if plan is None:
                plan = Unavailable("the planner has no plan yet")
        else:
            def sample() -> Observation:
                got = self.selection(workload)
                if isinstance(got, Unavailable):
                    raise got.error()
                startups = () if self.startups is None or got.selector is None else \
                    self.startups.startups(workload.namespace, got.selector)
                return observe(self.fleet, got.pods, got.gaps, startups)
            try:
                plan = self.plans.plan(workload.plan_key, (workload.namespace, workload.name),
                                       config, sample, now)
            except DataUnavailable as exc:
                plan = Unavailable(str(exc))
        if isinstance(plan, Unavailable):
            return plan
        if selection is None and plans is Plans.PEEK:  # the pods, for the record
            selection = self.selection(workload)
        pods = () if selection is None or isinstance(selection, Unavailable) \
            else selection.pods
        # ready as evaluate counts it for the other signals: explain's table and its JSON
        # (and the HPA's Value-mode divisor) read the same pods.
        return Value(plan.replicas * target.target, target, pods, len(pods),
                     ready=sum(1 for p in pods if p.ready), plan=plan)

    # -- activity ------------------------------------------------------------------------

    def active(self, workload: Workload, plans: Plans = Plans.ASK) -> bool | Unavailable:
        """IsActive (``activity``'s rule). The pods are selected once for every target,
        and the targets are evaluated in order until one is active."""
        trigger = workload.trigger
        selection = None if trigger.planner is not None else self.selection(workload)
        return self.activity(workload, (self.value(workload, t, plans, selection)
                                        for t in trigger.targets))

    def activity(self, workload: Workload,
                 values: Iterable[Value | Unavailable]) -> bool | Unavailable:
        """``activity`` over the trigger's values (in the order of its targets: one per
        target, from ``value``) and its demand source, for callers that have the values
        already (the recorder)."""
        source = workload.trigger.demand_source
        check = self.demand
        demand = None if not source or check is None else (lambda: check(source))
        return activity(zip(workload.trigger.targets, values, strict=False), demand)

    def demand_active(self, source: str) -> bool | Unavailable:
        """``activity`` of a demand source alone (the metrics API's demand metric, which
        needs no pod). ConfigError when no such source is declared."""
        check = self.demand
        if check is None:
            raise ConfigError("demandSource: this scaler has no demand sources configured")
        return activity((), lambda: check(source))

    def pending(self, workload: Workload) -> str:
        """The demand source's word for the record: "pending", "none", why it cannot tell,
        or "" when the trigger names none (or the scaler has no sources)."""
        source = workload.trigger.demand_source
        if not source or self.demand is None:
            return ""
        try:
            return "pending" if self.demand(source) else "none"
        except (DataUnavailable, ConfigError) as exc:
            return f"cannot tell: {exc}"


def activity(values: Iterable[tuple[Target, Value | Unavailable]],
             demand: Callable[[], bool] | None = None) -> bool | Unavailable:
    """The one rule of whether a workload is active (IsActive, StreamIsActive, the
    metrics API's demand metric, ``explain``, the simulator): active when any target's
    value is strictly above its activation threshold, or the demand source shows pending
    work; inactive only when every target's value is known and at or below its threshold
    and the demand source (if any) shows none. Anything else is Unavailable, with the
    first reason: a workload at zero replicas has no pods to show its load, and a target
    that cannot be read may be the busy one.

    An active target is enough whatever the others say (the workload is active at least
    that much; KEDA's GetMetrics of the unreadable one still fails on its own). Values are
    consumed lazily and the first active one ends it. ``demand``: pending work? It raises
    DataUnavailable when the source cannot tell."""
    unknown: Unavailable | None = None
    for target, got in values:
        if isinstance(got, Unavailable):
            unknown = unknown or got
        elif got.value > target.activation:
            return True
    if demand is not None:
        try:
            if demand():
                return True
        except DataUnavailable as exc:
            unknown = unknown or Unavailable(str(exc))
    return False if unknown is None else unknown
