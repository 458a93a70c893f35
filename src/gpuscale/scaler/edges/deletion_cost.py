"""Take the idlest replica (``gpuscale scaler --pod-deletion-cost``, opt-in).

When a planned workload's plan falls below its Ready pods, the HPA is about to remove some,
and a ReplicaSet removes first the pods with the lowest
``controller.kubernetes.io/pod-deletion-cost`` (Kubernetes 1.22+, beta, on by default;
ReplicaSet only - StatefulSets remove the highest ordinal whatever it says). So, while a
scale-down is pending, every REFRESH_S each Ready pod of such a workload gets that
annotation set to its requests in flight (vLLM's running plus waiting, rounded up): the
pods with the least work are the ones cut, and fewer requests are cut with them. A pod
whose load is not known gets the highest cost (the last to go), never a guess.

Writes stay few: a pod is patched only when its cost changed from what this scaler last
wrote, at most ``rate`` patches a second in all; nothing is written while no plan is
below its Ready pods. The annotation is advice the ReplicaSet reads at the moment it
scales down: a cost set REFRESH_S ago can be stale by then (a pod that took requests
since), which costs at worst what no annotation costs. Needs ``patch`` on pods (Helm
``scaler.podDeletionCost``; kube/access.py ``SCALER_DELETION_COST``). A refusal (403) is
said once in the log, with what to grant, and the workload is served as before.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter

from gpuscale.kube.errors import ApiError
from gpuscale.scaler.core.planner import Plan
from gpuscale.stream.records import PodRecord

log = logging.getLogger(__name__)

ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
REFRESH_S = 5.0  # a pending scale-down's costs are written again this often (if changed)
MAX_PATCHES_PER_S = 20.0
UNKNOWN_COST = 2**31 - 1  # int32's largest: a pod whose load is unknown goes last
IN_FLIGHT = ("vllm-running", "vllm-waiting")


class Annotator(Protocol):
    async def annotate_pod(self, namespace: str, name: str,
                           annotations: dict[str, str]) -> dict[str, Any]: ...


def cost(pod: PodRecord) -> int:
    """A pod's deletion cost: its requests in flight, or UNKNOWN_COST."""
    total = 0.0
    for name in IN_FLIGHT:
        v = pod.signals.get(name)
        if not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
            return UNKNOWN_COST
        total += float(v)
    return min(UNKNOWN_COST - 1, math.ceil(total))


Pending = Callable[[], Iterable[tuple[Plan, Sequence[PodRecord]]]]


class DeletionCosts:
    """Run by the scaler (scaler.root) beside the planners."""

    def __init__(self, rate: float = MAX_PATCHES_PER_S, refresh_s: float = REFRESH_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.refresh_s = refresh_s
        self._clock = clock
        self._written: dict[tuple[str, str], int] = {}  # (namespace, pod) -> cost written
        self._next = 0.0  # when the next patch may go (the rate)
        self._refused = False  # 403 said in the log already
        self.patches: Counter | None = None

    async def run(self, api: Annotator, pending: Pending,
                  registry: CollectorRegistry | None = None) -> None:
        """Write the pending scale-downs' costs every ``refresh_s`` until cancelled."""
        self.patches = Counter("gpuscale_scaler_deletion_cost_patches",
                               "pod-deletion-cost annotations written, by result.",
                               ["result"], registry=registry)
        while True:
            await self.write(api, pending())
            await asyncio.sleep(self.refresh_s)

    async def write(self, api: Annotator,
                    pending: Iterable[tuple[Plan, Sequence[PodRecord]]]) -> None:
        """One pass: the changed costs of every Ready pod of the workloads pending a
        scale-down."""
        seen: set[tuple[str, str]] = set()
        for _plan, pods in pending:
            for pod in pods:
                if not pod.ready:
                    continue  # a starting pod is cut first by the ReplicaSet anyway
                key = (pod.namespace, pod.name)
                seen.add(key)
                value = cost(pod)
                if self._written.get(key) == value:
                    continue
                await self._pace()
                result = await self._patch(api, pod, value)
                if self.patches is not None:
                    self.patches.labels(result).inc()
        # Forget pods of workloads no longer scaling down: their next scale-down writes
        # afresh (the annotation may have been changed meanwhile).
        self._written = {k: v for k, v in self._written.items() if k in seen}

    async def _pace(self) -> None:
        now = self._clock()
        wait = self._next - now
        self._next = max(now, self._next) + 1.0 / self.rate
        if wait > 0:
            await asyncio.sleep(wait)

    async def _patch(self, api: Annotator, pod: PodRecord, value: int) -> str:
        try:
            await api.annotate_pod(pod.namespace, pod.name, {ANNOTATION: str(value)})
        except ApiError as exc:
            if exc.status == 404:
                return "gone"  # the pod went meanwhile: nothing to do
            if exc.status == 403:
                if not self._refused:
                    self._refused = True
                    log.warning("--pod-deletion-cost: the API refused to annotate pods "
                                "(%s); grant the scaler's ServiceAccount patch on pods "
                                "(Helm scaler.podDeletionCost=true) or drop the flag", exc)
                return "forbidden"
            log.info("pod-deletion-cost of %s/%s not written: %s", pod.namespace,
                     pod.name, exc)
            return "failed"
        self._written[(pod.namespace, pod.name)] = value
        return "written"
