"""The planner's values (``scaler.core.planner``): its configuration, what it observes of a
workload each second, and the plan it makes with every term it came from. Pure values."""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpuscale.common.errors import DataUnavailable
from gpuscale.common.freshness import PLAN_STALE_S

DEFAULT_STARTUP_S = 300.0  # until pods have shown theirs: a slow start (cold node, big image)


class PlanUnavailable(DataUnavailable):
    """The planner cannot give a count it can stand behind; the message says why."""


@dataclass(frozen=True, slots=True)
class PlannerConfig:
    """One workload's planning parameters (trigger metadata; see ``scaler.core.trigger``)."""

    delay_s: float = 2.0  # the queueing-delay budget (the SLO less the prefill itself)
    ttft_s: float | None = None  # a TTFT objective: the budget follows the mean prompt
    ttft_per_token_s: float = 0.0  # and per prompt token: P tokens may take ttft_s + P x this
    startup_s: float | None = None  # creation to Ready of a new replica; None: measured
    prefill_tps: float = 30_000.0  # prompt tokens/s one replica prefills, fully busy
    decode_tps: float = 12_000.0  # generated tokens/s one replica decodes at full batch
    max_batch: int = 256  # sequences one replica runs at once (vLLM's max_num_seqs)
    utilization: float = 0.85  # the busy fraction the steady term aims at
    kv_target: float = 90.0  # percent of KV cache a pod may use before another is needed
    memory_s: float = 1200.0  # how long a recurring burst is remembered (15 min + a start-up)
    burst_s: float = 120.0  # the longest burst the burst term looks at
    late_share: float = 0.05  # of a minute's work that may wait past the budget (p95)
    trend: bool = True  # plan for the load's growth over a start-up
    hold_s: float | None = None  # scale-down hold; None: one start-up
    prompt_tokens: float = 1_000.0  # a request's tokens until the engine has shown its own
    output_tokens: float = 250.0
    stale_s: float = PLAN_STALE_S  # no usable observation this long: UNAVAILABLE
    #   (common.freshness names it beside the readings' staleness rule)
    resolution_s: float = 1.0  # the width of one bin of history (the planner's "second")
    drain_s: float = 30.0  # a removed pod's grace to finish its requests (Kubernetes': 30)
    spare_replicas: int = 0  # asked beyond the plan while a scale-up starts (``hedge``)

    def bins(self, seconds: float) -> int:
        """How many bins of history ``seconds`` are (at least one)."""
        return max(1, round(seconds / self.resolution_s))

    def work(self, prompt: float, output: float) -> float:
        """Replica-seconds of ``prompt`` prefilled and ``output`` generated tokens."""
        return prompt / self.prefill_tps + output / self.decode_tps


@dataclass(frozen=True, slots=True)
class PodLoad:
    """One Ready pod's own share of an observation (for the capacity it delivers)."""

    name: str
    prompt_tps: float
    generation_tps: float
    waiting: float


@dataclass(frozen=True, slots=True)
class Observation:
    """One moment of a workload: sums over its Ready pods that report, and its pods.
    ``pods``: each Ready pod's own load, when the caller has it (the capacity is then
    learned per pod; without it, from the sums)."""

    prompt_tps: float
    generation_tps: float
    finished_rate: float  # requests/s
    waiting: float
    running: float
    kv_cache: float  # percent, summed over Ready pods
    ready: int
    starting: int  # pods of the workload that are not Ready yet
    pods: tuple[PodLoad, ...] = ()
    # (pod, seconds from its creation to its first Ready) for the workload's pods whose
    # start-up the caller measured (its pod watch); seen again every second, counted once
    startups: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True, slots=True)
class Plan:
    """A planned replica count and every term it came from (for a person, and /metrics)."""

    replicas: int
    at: float  # when it was made (the caller's clock)
    steady: float
    burst: float
    concurrency: float
    kv: float
    backlog: float
    required: float  # max(steady, burst, concurrency, kv) + backlog
    unheld: int  # ceil(required), before the hold and the drain floor
    arrived: float  # work that arrived in the last second, replica-seconds
    request_work: float  # mean replica-seconds of one request
    capacity: float  # configured replica-seconds a Ready pod delivers per second (<= 1)
    ready: int
    starting: int
    warming: bool  # the planner has not seen a whole hold window yet
    growth: float = 0.0  # load growth over a start-up in steady, replica-seconds per second
    kv_growth: float = 0.0  # KV-cache fill over a start-up in kv, percent points
    burst_excess: float = 0.0  # the remembered excess inside burst, replica-seconds/s
    startup: float = DEFAULT_STARTUP_S  # the start-up planned with, seconds
    startup_source: str = "default"  # "configured", "measured" or "default"
    startup_pods: int = 0  # pods whose start-up was measured (0: configured or default)
    held: int = 0  # the count the hold keeps: the load that is here, without growth or backlog
    request_s: float = math.nan  # mean seconds a request runs (NaN: not a minute seen)
    drain_floor: int = 0  # pods kept so a scale-down cuts at most CUT_SHARE (0: not binding)
    batch_capacity: float = 1.0  # what a full KV cache's batch allows (<= 1; in capacity)
    spare: int = 0  # of ``replicas``: spares asked while a scale-up starts (``hedge``)
    # in steady's load: the decode of sequences that joined the batches this minute, counted
    # when they joined (``arrivals``), replica-seconds per second
    joined: float = 0.0

    def terms(self) -> dict[str, float]:
        return {"steady": self.steady, "burst": self.burst, "concurrency": self.concurrency,
                "kv": self.kv, "backlog": self.backlog, "required": self.required,
                "unheld": float(self.unheld),
                "arrived": self.arrived, "request_work": self.request_work,
                "capacity": self.capacity, "growth": self.growth,
                "kv_growth": self.kv_growth, "burst_excess": self.burst_excess,
                "startup": self.startup,
                "startup_pods": float(self.startup_pods), "held": float(self.held),
                "request_s": self.request_s, "drain_floor": float(self.drain_floor),
                "batch_capacity": self.batch_capacity, "spare": float(self.spare),
                "joined": self.joined,
                "ready": float(self.ready), "starting": float(self.starting)}

