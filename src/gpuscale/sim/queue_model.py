"""A queueing-model autoscaler, of llm-d workload-variant-autoscaler's kind: the fleet
sized from the arrival rate and each request's cost, so that the mean wait fits the SLO.

Source: llm-d workload-variant-autoscaler (b08b1c77): internal/config/loader.go
(``GLOBAL_OPT_INTERVAL`` 60s), pkg/analyzer (a queueing model of each variant),
internal/collector/registration/saturation.go (token means over ``[5m]``).
"""

from __future__ import annotations

from collections import deque

from gpuscale.models.serving import ServingModel, ServingParams
from gpuscale.models.slo import SLO_TTFT_S

WVA_INTERVAL_S = 60.0  # internal/config/loader.go: GLOBAL_OPT_INTERVAL default "60s"
TOKEN_WINDOW_S = 300.0  # saturation.go: rate(vllm:request_*_tokens_sum[5m]) / _count[5m]


def mm1_replicas(rate: float, service_s: float, wait_budget_s: float,
                 limit: int = 100_000) -> int | None:
    """The fewest replicas n, each an M/M/1 queue fed rate / n, whose mean wait in queue
    Wq = rho x service_s / (1 - rho) (rho = rate x service_s / n < 1) is within
    ``wait_budget_s``. 0 with no arrivals; None if no n up to ``limit`` will do (a budget
    of zero or less)."""
    if rate <= 0:
        return 0
    if wait_budget_s <= 0:
        return None
    for n in range(1, limit + 1):
        rho = rate * service_s / n
        if rho < 1 and rho * service_s / (1 - rho) <= wait_budget_s:
            return n
    return None


class QueueModel:
    """A ``Decider`` sizing the fleet from a queueing model every ``interval_s``.

    Arrival rate over the last interval = (requests finished + growth of the requests in
    the system, waiting or running) / interval: what the engine's counters give. Mean
    prompt and output tokens: of the requests finished in the last ``TOKEN_WINDOW_S``. A
    request's service time is its cost to a replica at full batch from the performance
    profile (``ServingParams``: prompt / prefill_tps + output / decode_tps_max, WVA's
    offline benchmark); its prefill, prompt / prefill_tps. Replicas: ``mm1_replicas`` with
    the SLO minus the prefill as the budget for waiting. No finished request yet, or an
    SLO the prefill alone misses: no decision."""

    def __init__(self, params: ServingParams, slo_s: float = SLO_TTFT_S,
                 interval_s: float = WVA_INTERVAL_S) -> None:
        self.p, self.slo, self.interval = params, slo_s, interval_s
        self._last: tuple[float, int, int] | None = None  # (time, finished, in system)
        self._marks: deque[tuple[float, int]] = deque()  # (time, finished) per evaluation
        self.rate = 0.0

    def __call__(self, model: ServingModel, now: float, current: int) -> int | None:
        if self._last is not None and now < self._last[0]:
            self._last = None
            self._marks.clear()
        finished = len(model.done)
        in_system = len(model.queue) + sum(len(r.running)
                                           for r in model.replicas + model.draining)
        if self._last is None:
            self._last = (now, finished, in_system)
            self._marks.append((now, finished))
            return None
        t0, done0, sys0 = self._last
        if now - t0 < self.interval:
            return None
        self._last = (now, finished, in_system)
        self.rate = max(0.0, (finished - done0 + in_system - sys0) / (now - t0))
        while len(self._marks) > 1 and self._marks[1][0] <= now - TOKEN_WINDOW_S:
            self._marks.popleft()
        recent = model.done[self._marks[0][1]:]  # finished since about TOKEN_WINDOW_S ago
        self._marks.append((now, finished))
        if not recent:
            return None
        prompt = sum(r.prompt for r in recent) / len(recent)
        output = sum(r.output for r in recent) / len(recent)
        prefill = prompt / self.p.prefill_tps
        service = prefill + output / self.p.decode_tps_max
        return mm1_replicas(self.rate, service, self.slo - prefill)
