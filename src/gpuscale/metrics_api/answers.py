"""What the metrics API answers, from memory: per-pod values and workload values.

The same rules as the KEDA path (``scaler.core.aggregate``): a Ready pod of the selection whose
reading is absent, stale or implausible, or a running pod the roster knows that has not
reported, makes the whole answer UNAVAILABLE (503) naming them - never a list with the pod
left out, because the HPA takes a pod missing from a Pods metric as using nothing when it
scales up. Pods that are not Ready and have no data yet (starting) are left out, as the
HPA leaves out pods that have not started. Values are rounded up to the milli-unit
(``quantity``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from gpuscale.common.errors import ConfigError, DataUnavailable, Unavailable
from gpuscale.metrics_api.served_metrics import (
    DEMAND,
    OBJECT_METRICS,
    OBJECT_RESOURCES,
    POD_METRICS,
)
from gpuscale.metrics_api.shapes import Item
from gpuscale.scaler.answers import Answers, Selection, Workload
from gpuscale.scaler.core.profiles import PLANNED, Target
from gpuscale.scaler.core.selector import Selector, SelectorError, parse_selector
from gpuscale.scaler.core.trigger import PLANNER_KEYS, TriggerConfig, parse_metadata
from gpuscale.scaler.state.history import TriggerHistory
from gpuscale.scaler.state.plan_book import TooManyPlans
from gpuscale.stream.records import PodRecord
from gpuscale.telemetry.model import Absent

EVERY_POD = Selector((), "")
SOURCE = "metrics-api"  # the plan book's keys of planners this API created
MAX_PLANS = 100  # of the scaler's plan book (1,000), whatever metric selectors readers send
GPU_WINDOW_S = 1  # the agent's tick: NVML samples are averaged over it


class NotFound(ConfigError):
    """A caller's request names no metric or object here (404, not 400)."""

    grpc_code = "NOT_FOUND"
    http_status = 404


class Targets(Protocol):
    def target(self, namespace: str, kind: str, name: str) -> Selector | Unavailable | None:
        """The pod selector of a Deployment or StatefulSet; None: no such object;
        Unavailable: why it cannot be known now."""
        ...


def signal_trigger(signal: str) -> TriggerConfig:
    """The trigger a metric of one signal stands for: that signal, summed over the pods."""
    return parse_metadata({"signal": signal, "targetValue": "1"})


class MetricAnswers:
    def __init__(self, answers: Answers, targets: Targets | None,
                 wall: Callable[[], float] = time.time,
                 history: TriggerHistory | None = None) -> None:
        """``answers``: the scaler's one answer function; ``targets``: the Deployments'
        and StatefulSets' selectors (the workload resolver), None without the API;
        ``history``: where the scaler notes who asks (scaler.state.history), so
        ``gpuscale explain`` and ``top`` show the workloads an HPA reads here."""
        self.answers = answers
        self.fleet = answers.fleet
        self._targets = targets
        self._wall = wall
        self._history = history

    def _when(self, records: Sequence[PodRecord]) -> float:
        """The wall time of the oldest record: the answer is at least this fresh."""
        age = max((self.fleet.age(r) for r in records), default=0.0)
        return self._wall() - age

    # -- pods ----------------------------------------------------------------------------

    def pods(self, namespace: str, name: str, metric: str, label_selector: str = "",
             metric_selector: str = "") -> list[Item]:
        """Values of ``metric`` for pod ``name`` (``*``: every pod the label selector
        picks). NotFound, ConfigError, DataUnavailable."""
        m = POD_METRICS.get(metric)
        if m is None:
            raise NotFound(f"the server could not find the metric {metric} for pods; "
                           f"served: {', '.join(sorted(POD_METRICS))}")
        if metric_selector.strip():
            raise ConfigError(f"metricLabelSelector: pod metric {metric} has no labels to "
                              "select on; leave metric.selector out")
        try:
            selector = parse_selector(label_selector) if label_selector.strip() else EVERY_POD
        except SelectorError as exc:
            raise ConfigError(f"labelSelector: {exc}") from None
        workload = Workload(namespace, "*", signal_trigger(m.signal), selector, SOURCE)
        selection = _known(self.answers.selection(workload))
        records, gaps = selection.pods, selection.gaps
        if name != "*":
            records = tuple(r for r in records if r.name == name)
            mine = f"{namespace}/{name} "
            gaps = tuple(g for g in gaps
                         if g.startswith(mine) or not g.startswith(f"{namespace}/"))
            if not records and not gaps:  # with a gap it may be on a silent node: 503
                raise NotFound(f"the server could not find the metric {metric} for pods "
                               f"{name}: no GPU pod {namespace}/{name} reports")
        _known(self.answers.value(workload, Target(m.signal, 1.0, 0.0),
                                  selection=Selection(records, gaps)))
        window = GPU_WINDOW_S if m.signal.startswith("gpu-") else None
        out = []
        for r in records:
            reading = r.signals.get(m.signal)
            if reading is None or isinstance(reading, Absent):
                continue  # starting (the answer refused any other absence)
            out.append(Item("Pod", "/v1", namespace, r.name, metric, float(reading) * m.scale,
                            self._when([r]), window, ""))
        return out

    # -- objects -------------------------------------------------------------------------

    def object(self, namespace: str, resource: str, name: str, metric: str,
               metric_selector: str = "") -> Item:
        """The workload value ``metric`` of Deployment or StatefulSet ``name``."""
        kind_of = OBJECT_RESOURCES.get(resource)
        om = OBJECT_METRICS.get(metric)
        if kind_of is None or om is None:
            served = ", ".join(sorted(OBJECT_METRICS)) if kind_of else \
                ", ".join(sorted(OBJECT_RESOURCES))
            raise NotFound(f"the server could not find the metric {metric} for {resource}; "
                           f"served: {served}")
        api_version, kind = kind_of
        if om.signal == DEMAND:
            return self._demand(namespace, kind, api_version, name, metric_selector)
        if self._targets is None:
            raise DataUnavailable("object metrics need the Kubernetes API (the workloads' "
                                  "selectors); this scaler runs without it")
        selector = self._targets.target(namespace, kind, name)
        if selector is None:
            raise NotFound(f'{resource} "{name}" not found in namespace {namespace}')
        if isinstance(selector, Unavailable):
            raise DataUnavailable(f"the pods of {kind} {namespace}/{name}: {selector.reason}")
        if om.signal == PLANNED:
            metadata = {"profile": "vllm-planner", **planner_settings(metric_selector)}
        else:
            if metric_selector.strip():
                raise ConfigError(f"metricLabelSelector: {metric} takes no selector")
            metadata = {"signal": om.signal, "targetValue": "1"}
        trigger = parse_metadata(metadata)
        workload = Workload(namespace, f"{kind}/{name}", trigger, selector, SOURCE)
        self._note(workload, metadata)
        selection = _known(self.answers.selection(workload))
        if om.signal == PLANNED:
            self._room_for(workload)
        value = _known(self.answers.value(workload, trigger.targets[0], selection=selection))
        return Item(kind, api_version, namespace, name, metric, value.value,
                    self._when(selection.pods), None, metric_selector)

    def _demand(self, namespace: str, kind: str, api_version: str, name: str,
                metric_selector: str) -> Item:
        """gpuscale_demand_pending: 1 while the named demand source shows pending work.
        Needs no pod (the workload may be at zero), only the object: 404 when the scaler
        knows the workloads and this one is not among them."""
        pairs = dict(p.partition("=")[::2] for p in metric_selector.replace(" ", "")
                     .split(",") if p)
        source = pairs.get("demandSource", "")
        if not source or set(pairs) != {"demandSource"}:
            raise ConfigError("metricLabelSelector: gpuscale_demand_pending takes "
                              "demandSource=NAME (a demand source of the scaler's config)")
        if self._targets is not None and \
                self._targets.target(namespace, kind, name) is None:
            raise NotFound(f'{kind.lower()}s.apps "{name}" not found in namespace '
                           f"{namespace}")
        # the one activity rule (scaler.answers.activity), of the source alone: ConfigError
        # when no such source is declared, DataUnavailable when it cannot tell
        pending = _known(self.answers.demand_active(source))
        return Item(kind, api_version, namespace, name, "gpuscale_demand_pending",
                    1.0 if pending else 0.0, self._wall(), None, metric_selector)

    def _note(self, workload: Workload, metadata: dict[str, str]) -> None:
        """Remembered for the operator tools, as KEDA's asks are (bounded there), under
        "Kind/name", which no ScaledObject's name can be. An HPA reading a planned and a
        plain metric of one workload: the planned one is what explain shows."""
        if self._history is None:
            return
        ns, name = workload.namespace, workload.name
        seen = self._history.get(ns, name)
        if seen is not None and seen.source == SOURCE and \
                _planned(seen.config) and not _planned(workload.trigger):
            self._history.note(ns, name, seen.metadata, seen.config, self.fleet.now(),
                               SOURCE, workload.selector)  # still read: the planner's stays
            return
        self._history.note(ns, name, metadata, workload.trigger, self.fleet.now(), SOURCE,
                           workload.selector)

    def _room_for(self, workload: Workload) -> None:
        """The KEDA planners share the book: this API's take a part of it."""
        plans = self.answers.plans
        if workload.plan_key in plans:
            return
        planned = plans.keys()
        ours = sum(1 for k in planned if isinstance(k, tuple) and k[:1] == (SOURCE,))
        if ours >= MAX_PLANS:
            raise TooManyPlans(f"the metrics API already plans {ours} workload settings "
                               f"(limit {MAX_PLANS}, so KEDA's planners keep room); "
                               "give HPAs of one workload the same metric selector")


_T = TypeVar("_T")


def _planned(trigger: TriggerConfig) -> bool:
    return any(t.signal == PLANNED for t in trigger.targets)


def _known(got: _T | Unavailable) -> _T:
    if isinstance(got, Unavailable):
        raise got.error()
    return got


def planner_settings(metric_selector: str) -> dict[str, str]:
    """The planner's settings from a metric selector of ``key=value`` pairs, keys as in a
    vllm-planner trigger's metadata (ttftSeconds=2,startupSeconds=180). ConfigError for
    any other form."""
    if not metric_selector.strip():
        return {}
    out: dict[str, str] = {}
    try:
        requirements = parse_selector(metric_selector).requirements
    except SelectorError as exc:
        raise ConfigError(f"metricLabelSelector: {exc}") from None
    for req in requirements:
        if req.op != "=" or req.key not in PLANNER_KEYS or len(req.values) != 1:
            raise ConfigError(f"metricLabelSelector: {req.key!r}: the planner takes "
                              f"key=value pairs of {', '.join(sorted(PLANNER_KEYS))}")
        out[req.key] = next(iter(req.values))
    return out
