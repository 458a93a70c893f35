"""A replica model of an LLM inference server (vLLM-like), stepped in fixed time slices.

Assumptions (defaults for a Llama-3.1-8B-class model on one H100; order-of-magnitude
figures from public vLLM benchmarks, to be replaced by measured ones where a GPU is lent):

- Continuous batching: a replica takes waiting requests while its batch has room
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
  ``cold_start_s`` (image pull + model load).
- A removed replica drains, as a pod does on SIGTERM behind a Service: it takes no new
  requests, finishes the ones it runs, and goes away when done or after ``drain_s``
  (terminationGracePeriodSeconds; 30 s is Kubernetes' default), billed until then. Requests
  still running at the deadline go back to the front of the queue and start over.
- Requests wait in one shared queue and go, oldest first, to the ready replica with the
  fewest running requests (a gateway balancing on outstanding requests).
"""

from __future__ import annotations

import heapq
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
    drain_s: float = 30.0


@dataclass(slots=True)
class InFlightRequest:
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
    running: list[InFlightRequest] = field(default_factory=list)
    removed_at: float | None = None  # draining since

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


class ServingModel:
    def __init__(self, params: ServingParams = ServingParams()) -> None:
        self.p = params
        self.replicas: list[Replica] = []  # the ones that take requests (or will)
        self.draining: list[Replica] = []  # removed, finishing what they run
        self.queue: deque[InFlightRequest] = deque()
        self.done: list[InFlightRequest] = []
        self.gpu_seconds = 0.0

    def set_replicas(self, n: int, now: float, warm: bool = False) -> None:
        """Scale to ``n``: new replicas start cold (``warm``: already running, for the
        replicas that exist when a simulation starts); removed ones (the newest first, as
        a ReplicaSet picks the youngest pods) drain."""
        while len(self.replicas) < n:
            self.replicas.append(Replica(now, now if warm else now + self.p.cold_start_s))
        while len(self.replicas) > n:
            gone = self.replicas.pop()
            if gone.running:
                gone.removed_at = now
                self.draining.append(gone)

    def _end_drains(self, now: float) -> None:
        for rep in [d for d in self.draining if not d.running or
                    now - (d.removed_at or now) >= self.p.drain_s]:
            self.draining.remove(rep)
            for r in reversed(rep.running):  # cut off at the deadline: start over
                r.prefilled, r.generated = False, 0.0
                self.queue.appendleft(r)

    def arrive(self, requests: list[InFlightRequest]) -> None:
        self.queue.extend(requests)

    def step(self, now: float, dt: float) -> None:
        self._end_drains(now)
        self.gpu_seconds += (len(self.replicas) + len(self.draining)) * dt
        ready = [rep for rep in self.replicas if now >= rep.ready_at]
        self._dispatch(ready, dt)
        for rep in ready + self.draining:
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

    def _dispatch(self, ready: list[Replica], dt: float) -> None:
        """Hand waiting requests, oldest first, to the ready replica with the fewest running
        (a gateway's least-outstanding-requests balancing) while its batch, its KV cache and
        this step's prefill budget allow - so a burst spreads over the replicas instead of
        piling prefills on one, as a scheduler with chunked prefill would. A replica that
        cannot take the request at the head is done for this step."""
        if not self.queue or not ready:
            return
        p = self.p
        kv = [rep.kv_used() for rep in ready]
        prefill = [0.0] * len(ready)
        heap = [(len(rep.running), i) for i, rep in enumerate(ready)
                if len(rep.running) < p.max_batch]
        heapq.heapify(heap)
        while self.queue and heap:
            n, i = heapq.heappop(heap)
            rep, nxt = ready[i], self.queue[0]
            if kv[i] + nxt.prompt + nxt.output > p.kv_tokens and rep.running:
                continue
            if prefill[i] > 0 and prefill[i] + nxt.prompt > p.prefill_tps * dt:
                continue
            self.queue.popleft()
            rep.running.append(nxt)
            kv[i] += nxt.prompt + nxt.output
            prefill[i] += nxt.prompt
            if n + 1 < p.max_batch:
                heapq.heappush(heap, (n + 1, i))

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
