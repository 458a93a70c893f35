"""A replica model of an LLM inference server (vLLM-like), stepped in fixed time slices.

Assumptions (defaults for a Llama-3.1-8B-class model on one H100; order-of-magnitude
figures from public vLLM benchmarks, to be replaced by measured ones where a GPU is lent):

- Continuous batching: a replica admits waiting requests while its batch has room
  (``max_batch``) and their context fits the KV cache (``kv_tokens``).
- Each step, a replica spends its time first on prefill of newly admitted prompts
  (``prefill_tps`` tokens/s), then decodes: every running request gains
  ``decode_tps_per_seq`` tokens/s, scaled down when the batch's aggregate would exceed
  ``decode_tps_max`` (memory-bandwidth bound).
- Time to first token = time queued + the prefills ahead of it in its replica's step +
  its own prefill. Prefill beyond one step simply leaves that step no time to decode.
- GPU duty cycle saturates with a small batch: 100 % with ``saturating_batch`` or more
  running requests, proportionally below; 0 when idle (so utilization cannot tell a
  replica with 4 requests from one with 60 - the reason queue signals exist).
- A new replica is billed from the moment it is created but serves only after
  ``cold_start_s`` (image pull + model load); a removed replica stops at once (its
  requests go back to the queue).
- Requests are routed to the shared queue; replicas pull from it (a gateway's behaviour).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class ServingParams:
    max_batch: int = 64
    kv_tokens: int = 400_000
    prefill_tps: float = 20_000.0
    decode_tps_per_seq: float = 60.0
    decode_tps_max: float = 2_500.0
    saturating_batch: int = 4
    cold_start_s: float = 90.0


@dataclass(slots=True)
class Request:
    arrival: float
    prompt: int
    output: int
    generated: float = 0.0
    prefilled: bool = False
    first_token: float | None = None


@dataclass(slots=True)
class Replica:
    created: float
    ready_at: float
    running: list[Request] = field(default_factory=list)

    def kv_used(self) -> int:
        return sum(r.prompt + int(r.generated) for r in self.running)


@dataclass(frozen=True, slots=True)
class ReplicaSignals:
    """What the simulated telemetry reports for one replica after a step."""

    ready: bool
    duty_cycle: float  # GPU utilization, percent
    running: int
    waiting: float  # this replica's share of the shared queue
    kv_cache: float  # percent


class ServingFleet:
    def __init__(self, params: ServingParams = ServingParams()) -> None:
        self.p = params
        self.replicas: list[Replica] = []
        self.queue: deque[Request] = deque()
        self.done: list[Request] = []
        self.gpu_seconds = 0.0

    def set_replicas(self, n: int, now: float, warm: bool = False) -> None:
        """Scale to ``n``: new replicas start cold (``warm``: already running, for the
        replicas that exist when a simulation starts); removed ones (the newest first) give
        their requests back to the front of the queue."""
        while len(self.replicas) < n:
            self.replicas.append(Replica(now, now if warm else now + self.p.cold_start_s))
        while len(self.replicas) > n:
            gone = self.replicas.pop()
            for r in reversed(gone.running):
                r.prefilled, r.generated = False, 0.0
                self.queue.appendleft(r)

    def arrive(self, requests: list[Request]) -> None:
        self.queue.extend(requests)

    def step(self, now: float, dt: float) -> None:
        self.gpu_seconds += len(self.replicas) * dt
        for rep in self.replicas:
            if now < rep.ready_at:
                continue
            self._admit(rep, dt)
            elapsed = 0.0
            for r in rep.running:  # prefill first, one prompt after another
                if not r.prefilled:
                    elapsed += r.prompt / self.p.prefill_tps
                    r.prefilled = True
                    r.first_token = now + elapsed
            budget = dt - elapsed  # what is left of the step for decoding
            if budget <= 0 or not rep.running:
                continue
            per_seq = min(self.p.decode_tps_per_seq,
                          self.p.decode_tps_max / len(rep.running))
            for r in rep.running:
                r.generated += per_seq * budget
            finished = [r for r in rep.running if r.generated >= r.output]
            rep.running = [r for r in rep.running if r.generated < r.output]
            self.done.extend(finished)

    def _admit(self, rep: Replica, dt: float) -> None:
        """Take waiting requests while the batch, the KV cache and this step's prefill
        budget allow (so a burst spreads over the replicas instead of piling prefills on
        the first one, as a scheduler with chunked prefill would)."""
        kv = rep.kv_used()
        prefill = 0.0
        while self.queue and len(rep.running) < self.p.max_batch:
            nxt = self.queue[0]
            if kv + nxt.prompt + nxt.output > self.p.kv_tokens and rep.running:
                break
            if prefill > 0 and prefill + nxt.prompt > self.p.prefill_tps * dt:
                break
            self.queue.popleft()
            rep.running.append(nxt)
            kv += nxt.prompt + nxt.output
            prefill += nxt.prompt

    def signals(self, now: float) -> list[ReplicaSignals]:
        ready = [r for r in self.replicas if now >= r.ready_at]
        share = len(self.queue) / len(ready) if ready else 0.0
        out = []
        for rep in self.replicas:
            up = now >= rep.ready_at
            n = len(rep.running)
            out.append(ReplicaSignals(
                ready=up,
                duty_cycle=min(100.0, 100.0 * n / self.p.saturating_batch) if up else 0.0,
                running=n, waiting=share if up else 0.0,
                kv_cache=100.0 * rep.kv_used() / self.p.kv_tokens if up else 0.0))
        return out
