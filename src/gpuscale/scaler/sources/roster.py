"""Which pods must have reported before the scaler may answer OK: the scaler knows which
pods exist, so a pod that is silent is missing, never zero.

The fleet view holds what agents said; it cannot see a pod whose agent never spoke - an
agent still starting, one that was never reached, a node forgotten while its pods run.
A roster names those gaps for one workload, and the service answers UNAVAILABLE while any
is open:

- ``AgentRoster`` (static agent addresses, no Kubernetes API): every configured agent must
  have delivered one complete update; until then no workload can be answered, since any
  of them may have pods there. Two agents standing for one node are a gap too.
- ``PodRoster`` (with the API): a watch of the running pods, as the HPA controller keeps
  one. Every Ready pod of the workload that holds GPUs (a container limit or request of an
  ``nvidia.com/`` resource) must have a record; the gap names the pod, its node and what
  that node's agent is doing. Pods that are not Ready and have no record are starting
  and carry no load, as in ``evaluate``. While the watch is down the last listed pods
  stand in, for ``list_stale_after`` seconds: after that a pod that became Ready since
  could be missed, so every workload is a gap until the watch is back.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from gpuscale.common.freshness import POD_LIST_STALE_S, is_stale
from gpuscale.kube.replies import int_at, list_at, obj_at, str_at
from gpuscale.scaler.core.selector import Selector
from gpuscale.stream.records import PodRecord
from gpuscale.stream.subscriber import AgentSubscriber, LinkState

if TYPE_CHECKING:  # the Kubernetes client is imported only where the pod watch is built
    from gpuscale.kube.api import KubeApi

GPU_RESOURCE_PREFIXES = ("nvidia.com/", "amd.com/")  # resources that are GPUs
LIST_STALE_AFTER_S = POD_LIST_STALE_S  # the last listed pods stand in this long while the
#   watch is down (named beside the staleness rule, common.freshness)
MAX_RUNNING_PODS = 200_000
_CACHE_ENTRIES = 20_000  # as the fleet view's: one per ScaledObject at 10,000 and room
_CACHE_BYTES = 8 * 1024 * 1024  # of selector text held as cache keys


class Roster(Protocol):
    def problems(self, namespace: str, selector: Selector,
                 records: Sequence[PodRecord]) -> list[str]:
        """Why the workload's records may not be all of its pods ([] when they are)."""
        ...

    def ready(self) -> tuple[bool, str]:
        """Whether answers can be given at all yet, and a line for /readyz."""
        ...


class AgentRoster:
    """Static addresses: every configured agent must have reported; no node twice."""

    def __init__(self, subscriber: AgentSubscriber) -> None:
        self._sub = subscriber

    def problems(self, namespace: str, selector: Selector,
                 records: Sequence[PodRecord]) -> list[str]:
        out = [f"agent {address} has not reported ({why}): its node's pods are unknown"
               for address, why in self._sub.waiting()]
        return out + self.conflicts({r.node for r in records})

    def conflicts(self, nodes: set[str]) -> list[str]:
        """A gap for each of ``nodes`` that two current links stand for."""
        claimed = self._sub.conflicts()
        return [f"node {n} is claimed by agents {' and '.join(claimed[n])}: their pods "
                f"cannot be told apart" for n in sorted(nodes & claimed.keys())]

    def node_state(self, node: str) -> str:
        """What the agent(s) standing for ``node`` are doing, for a gap's reason."""
        links = [s for s in self._sub.states() if s.identity == node]
        if not links:
            return f"no agent reports for node {node}"
        return "; ".join(f"agent {s.address}: {_doing(s)}" for s in links)

    def ready(self) -> tuple[bool, str]:
        states = self._sub.states()
        waiting = [s.address for s in states if s.waiting()]
        if not states:
            return False, "no agents configured or discovered yet"
        if waiting:
            return False, (f"waiting for {len(waiting)} of {len(states)} agents: "
                           f"{', '.join(sorted(waiting)[:5])}")
        return True, f"{len(states)} agents reporting"


def _doing(s: LinkState) -> str:
    if s.waiting():
        return f"has not reported ({s.waiting()})"
    if not s.connected:
        return f"disconnected ({s.error or 'reconnecting'})"
    return "connected, but this pod is not in its updates"


@dataclass(frozen=True, slots=True)
class RunningPod:
    """What the roster keeps of a running pod (not its whole JSON)."""

    namespace: str
    name: str
    node: str
    labels: Mapping[str, str]
    ready: bool
    gpus: bool  # holds a GPU resource
    startup_s: float | None = None  # creation to first Ready (see ``startup_of``)


def _timestamp(text: str) -> float | None:
    """An RFC 3339 time as the API writes it (``2026-11-26T07:56:14Z``), as POSIX
    seconds; None when absent or not one."""
    if not 0 < len(text) <= 40:
        return None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    return when.timestamp() if when.tzinfo is not None else None


def startup_of(raw: Mapping[str, Any], ready: Mapping[str, Any]) -> float | None:
    """Seconds from the pod's creation to its first Ready: the Ready condition's last
    transition, while no container has restarted (a restart makes it a later one). None
    when not measurable that way: a container restarted or not reported yet, timestamps
    missing or out of order."""
    containers = list_at(raw, "status", "containerStatuses")
    if not containers or any(int_at(c, "restartCount", default=-1) != 0 for c in containers):
        return None
    created = _timestamp(str_at(raw, "metadata", "creationTimestamp"))
    became = _timestamp(str_at(ready, "lastTransitionTime"))
    if created is None or became is None or became <= created:
        return None
    return became - created


def running_pod(raw: dict[str, Any]) -> RunningPod:
    """The fields the roster reads, from a pod as the API returns it (JSON; a field of the
    wrong type reads as absent)."""
    gpus = False
    for c in list_at(raw, "spec", "containers"):
        names = [*obj_at(c, "resources", "limits"), *obj_at(c, "resources", "requests")]
        gpus = gpus or any(str(n).startswith(GPU_RESOURCE_PREFIXES) for n in names)
    ready = next((c for c in list_at(raw, "status", "conditions")
                  if str_at(c, "type") == "Ready" and str_at(c, "status") == "True"), None)
    labels = obj_at(raw, "metadata", "labels")
    return RunningPod(str_at(raw, "metadata", "namespace"), str_at(raw, "metadata", "name"),
                      str_at(raw, "spec", "nodeName"),
                      {str(k): str(v) for k, v in labels.items()}, ready is not None, gpus,
                      None if ready is None else startup_of(raw, ready))


class PodRoster:
    """With the API: Ready running GPU pods of the workload must all have records."""

    def __init__(self, api: KubeApi, agents: AgentRoster,
                 backoff_s: tuple[float, ...] | None = None,
                 list_stale_after: float = LIST_STALE_AFTER_S,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        from gpuscale.kube.api import Collection
        from gpuscale.kube.listwatch import BACKOFF_S

        self._agents = agents
        self._stale_after = list_stale_after
        self._monotonic = monotonic
        self._down_since: float | None = None
        self._by_ns: dict[str, list[RunningPod]] = {}
        # Start-ups the watch saw happen: (namespace, name) of pods seen running and not
        # Ready, of pods seen Ready, and the start-up of each seen going from one to the
        # other for the first time. A pod Ready when first listed is not measured: its
        # Ready condition's last transition may be a recovery long after its start.
        self._seen_unready: set[tuple[str, str]] = set()
        self._seen_ready: set[tuple[str, str]] = set()
        self._started: dict[tuple[str, str], float] = {}
        self._version = 0
        self._cache: dict[tuple[str, str], tuple[int, tuple[RunningPod, ...]]] = {}
        self._cache_bytes = 0
        self.watch = api.list_watch(
            Collection("v1", "pods", field_selector="status.phase=Running"),
            "running pod watch", on_change=self._index, backoff_s=backoff_s or BACKOFF_S,
            max_items=MAX_RUNNING_PODS, keep=running_pod)

    async def run(self) -> None:
        await self.watch.run()

    async def _index(self) -> None:
        by_ns: dict[str, list[RunningPod]] = {}
        present = set()
        for p in self.watch.items.values():
            if p.gpus:
                by_ns.setdefault(p.namespace, []).append(p)
                key = (p.namespace, p.name)
                present.add(key)
                if not p.ready:
                    if key not in self._seen_ready:
                        self._seen_unready.add(key)
                elif key not in self._seen_ready:
                    self._seen_ready.add(key)
                    if key in self._seen_unready and p.startup_s is not None:
                        self._started[key] = p.startup_s
        self._seen_unready &= present
        self._seen_ready &= present
        self._started = {k: v for k, v in self._started.items() if k in present}
        self._by_ns = by_ns
        self._version += 1

    def expected(self, namespace: str, selector: Selector) -> tuple[RunningPod, ...]:
        """The workload's Ready running GPU pods (cached until the pods change)."""
        key = (namespace, selector.text)
        hit = self._cache.get(key)
        if hit is None or hit[0] != self._version:
            if len(self._cache) >= _CACHE_ENTRIES or self._cache_bytes > _CACHE_BYTES:
                self._cache.clear()
                self._cache_bytes = 0
            if key not in self._cache:
                self._cache_bytes += len(namespace) + len(selector.text)
            pods = tuple(p for p in self._by_ns.get(namespace, ())
                         if p.ready and selector.matches(p.labels))
            hit = self._cache[key] = (self._version, pods)
        return hit[1]

    def startups(self, namespace: str, selector: Selector) -> tuple[tuple[str, float], ...]:
        """(pod, seconds from creation to first Ready) of the workload's Ready GPU pods
        that the watch saw become Ready (the planner's measured start-up)."""
        started = self._started
        return tuple((p.name, started[(namespace, p.name)])
                     for p in self.expected(namespace, selector)
                     if (namespace, p.name) in started)

    def problems(self, namespace: str, selector: Selector,
                 records: Sequence[PodRecord]) -> list[str]:
        if self.watch.synced_at is None:
            return [f"the running pods are not listed yet ({self.watch.state()[1]})"]
        down = self._down_for()
        if down is not None:
            return [f"the running pods are not known: the pod watch has been down for "
                    f"{down:.1f}s ({self.watch.state()[1]})"]
        have = {r.name for r in records}
        out = [f"{namespace}/{p.name} on {p.node or 'no node'} (running and Ready, no data: "
               f"{self._agents.node_state(p.node)})"
               for p in self.expected(namespace, selector) if p.name not in have]
        return out + self._agents.conflicts(
            {r.node for r in records} | {p.node for p in self.expected(namespace, selector)})

    def _down_for(self) -> float | None:
        """Seconds the watch has been down, once past ``list_stale_after``; else None."""
        connected, _ = self.watch.state()
        if connected:
            self._down_since = None
            return None
        now = self._monotonic()
        if self._down_since is None:
            self._down_since = now
        down = now - self._down_since
        return down if is_stale(down, self._stale_after) else None

    def ready(self) -> tuple[bool, str]:
        if self.watch.synced_at is None:
            return False, f"running pods not listed yet ({self.watch.state()[1]})"
        down = self._down_for()
        if down is not None:
            return False, f"the pod watch has been down for {down:.1f}s"
        _, agents = self._agents.ready()
        pods = sum(len(v) for v in self._by_ns.values())
        return True, f"{pods} running GPU pods known; {agents}"
