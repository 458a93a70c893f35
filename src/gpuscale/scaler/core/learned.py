"""What the planner (``scaler.core.planner``) learns from a workload's own pods: how long a
new replica takes to become Ready (**start-up**), and what a Ready pod really delivers of
its configured work per second (**capacity**: from a queue that shows it, and before any
queue from the batch the KV cache holds, ``batch_capacity``). Each only makes a plan
safer: the start-up is a high quantile of what pods showed, and a capacity is taken only
below the configuration."""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpuscale.scaler.core.plan_values import DEFAULT_STARTUP_S, Observation, PlannerConfig

STARTUP_SAMPLES = 32  # the newest pods' start-ups kept
STARTUP_MIN_SAMPLES = 3  # measured start-ups needed before they replace the default
STARTUP_QUANTILE = 0.9  # of the measured start-ups: what the plan looks ahead by
MAX_STARTUP_S = 7200.0  # a longer "start-up" is not one (a Ready pod restarted later)
SATURATED_S = 5  # a queue this long means the Ready pods serve all they can
CAPACITY_WEIGHT = 0.05  # of each saturated second in the learned capacity
MIN_CAPACITY = 0.25
BATCH_MIN_FINISHED = 10  # requests finished in the window before their mean prompt counts
BATCH_MAX_PREFILL = 0.9  # a busier prefill share leaves decode's speed unreadable


class Startup:
    """The start-up planned with: ``startup_s`` when configured; otherwise the
    ``STARTUP_QUANTILE`` of the newest ``STARTUP_SAMPLES`` pods' measured start-ups once
    ``STARTUP_MIN_SAMPLES`` have shown one; until then ``DEFAULT_STARTUP_S``."""

    def __init__(self, config: PlannerConfig) -> None:
        self.config = config
        self._startups: dict[str, float] = {}  # pod -> measured start-up, oldest first
        self._startup = (config.startup_s, "configured") if config.startup_s is not None \
            else (DEFAULT_STARTUP_S, "default")

    @property
    def seconds(self) -> float:
        return self._startup[0]

    @property
    def source(self) -> str:
        """"configured", "measured" or "default"."""
        return self._startup[1]

    @property
    def pods(self) -> int:
        """Pods whose start-up the measured figure comes from (0: configured or default)."""
        return len(self._startups) if self.source == "measured" else 0

    def learn(self, obs: Observation) -> None:
        """Keep each pod's measured start-up once (the newest ``STARTUP_SAMPLES`` pods),
        and plan with their ``STARTUP_QUANTILE`` unless the trigger gave one."""
        if self.config.startup_s is not None or not obs.startups:
            return
        added = False
        for pod, seconds in obs.startups:
            if pod in self._startups or not 0 < seconds <= MAX_STARTUP_S:
                continue
            self._startups[pod] = seconds
            added = True
            if len(self._startups) > STARTUP_SAMPLES:
                del self._startups[next(iter(self._startups))]
        if added and len(self._startups) >= STARTUP_MIN_SAMPLES:
            ordered = sorted(self._startups.values())
            rank = math.ceil(STARTUP_QUANTILE * len(ordered)) - 1  # nearest rank
            self._startup = (ordered[max(0, rank)], "measured")


class Capacity:
    """What a Ready pod delivers of the configured replica-seconds per second (<= 1)."""

    def __init__(self, config: PlannerConfig) -> None:
        self.config = config
        self.value = 1.0
        self._queued = 0  # bins in a row with requests waiting
        self._queued_pods: dict[str, int] = {}  # the same, per Ready pod

    def clear(self) -> None:
        """Forget the queues seen (the value learned stays)."""
        self._queued = 0
        self._queued_pods.clear()

    def learn(self, obs: Observation, served: float, bins: int) -> None:
        """While requests wait at a pod for a while, it serves all it can: its work is
        what one replica delivers of the configured capacity. Per pod when the
        observation has them (one saturated pod among idle ones says nothing of the idle
        ones: a sum would lower the capacity of all), else from the sums. Learned slowly,
        and only ever below the configuration (a capacity set too high would plan too few
        replicas; one set too low only costs GPU-hours)."""
        enough = self.config.bins(SATURATED_S)
        if obs.pods:
            queued = {p.name: self._queued_pods.get(p.name, 0) + bins
                      for p in obs.pods if p.waiting >= 1}
            self._queued_pods = queued
            self._queued = 0
            full = [p for p in obs.pods if queued.get(p.name, 0) >= enough]
            if not full:
                return
            sample = sum(min(1.0, self.config.work(p.prompt_tps, p.generation_tps))
                         for p in full) / len(full)
        else:
            self._queued_pods.clear()
            self._queued = self._queued + bins if obs.waiting >= 1 and obs.ready else 0
            if self._queued < enough:
                return
            sample = min(1.0, served / obs.ready)
        self.value = max(MIN_CAPACITY, min(1.0, self.value + CAPACITY_WEIGHT * (
            sample - self.value)))


@dataclass(frozen=True, slots=True)
class BatchSums:
    """Sums over the same recent seconds (per-second values of the Ready pods, summed):
    prompt and generated tokens/s, requests finished/s, sequences running, KV-cache
    percent, and sequences running x the share of their pod's second that prefill left
    to decode."""

    prompt: float
    generated: float
    finished: float
    running: float
    kv: float
    decoding: float


def decoding(config: PlannerConfig, obs: Observation) -> float:
    """Running sequences x the share of a pod's second that prefill leaves them to decode
    (``BatchSums.decoding``'s per-second value)."""
    if obs.ready <= 0:
        return 0.0
    return obs.running * max(0.0, 1.0 - obs.prompt_tps / (config.prefill_tps * obs.ready))


def batch_capacity(config: PlannerConfig, sums: BatchSums, resolution_s: float = 1.0) -> float:
    """What a replica delivers of its configured work once its KV cache is full, on the
    prompts and outputs its pods show (1 when that is no bound, or not readable yet).

    A replica runs at most ``slots`` sequences: ``max_batch``, or as many as fill its KV
    cache at the KV each running sequence holds now (running over KV percent, x 100).
    Decode gets what prefill leaves: at ``lam`` requests/s of prompt P, prefill takes
    lam x P / prefill_tps of each second, and each sequence decodes at ``v`` tokens/s in the
    rest (``v``: the generated tokens/s per running sequence the pods show, over that rest;
    at most ``decode_tps`` over the slots). A request of output O then holds its slot
    O / (v x (1 - lam x P / prefill_tps)) seconds, and Little's law bounds
    lam x that <= slots: lam <= slots x v / (O + slots x v x P / prefill_tps). The work of
    that many requests is the capacity. Long prompts are where it binds: prefill takes
    most of a replica's time, the sequences it leaves decode slowly and hold their KV
    longer, and the cache fills before the configured figures are reached - which a
    replica otherwise shows only once requests queue at it (``Capacity``).

    Not readable (1): fewer than ``BATCH_MIN_FINISHED`` requests finished, no sequence or
    KV in use, or a prefill share above ``BATCH_MAX_PREFILL`` (decode's speed is then
    within the noise)."""
    c = config
    if (sums.finished * resolution_s < BATCH_MIN_FINISHED or sums.running <= 0
            or sums.kv <= 0 or sums.generated <= 0
            or sums.decoding < (1.0 - BATCH_MAX_PREFILL) * sums.running):
        return 1.0
    prompt = sums.prompt / sums.finished  # tokens of one request
    output = sums.generated / sums.finished
    slots = min(float(c.max_batch), 100.0 * sums.running / sums.kv)
    speed = min(sums.generated / sums.decoding, c.decode_tps / slots)
    rate = slots * speed / (output + slots * speed * prompt / c.prefill_tps)
    return max(MIN_CAPACITY, min(1.0, rate * c.work(prompt, output)))
