"""A replica model of an LLM inference server (vLLM-like), stepped in fixed time slices.

Assumptions (defaults for a Llama-3.1-8B-class model in bf16; ``GPU_TYPES`` has the figures
per GPU, each with its source):

- Continuous batching: a replica takes waiting requests while its batch has room
  (``max_batch``) and their context fits the KV cache (``kv_tokens``).
- Each replica keeps a busy clock. Prefill is served first, one prompt after another: a
  request's prefill starts at the latest of the replica's clock, the step's start and the
  request's own arrival, and takes prompt/``prefill_tps`` seconds; its first token comes
  when its prefill ends (so time to first token is never shorter than its own prefill and
  never counted from before it arrived). A prefill that runs past the step's end carries
  into the next step, which then has that much less time.
- Decode gets what prefill leaves of the step: every running request whose first token
  is out gains ``decode_tps_per_seq`` tokens/s, scaled down when the batch's aggregate
  would exceed ``decode_tps_max`` (memory-bandwidth bound), for its share of the step
  after its first token, times the fraction of the step left after prefill. So a replica
  never does more than one replica-second of work per second:
  prompt/prefill_tps + decoded/decode_tps_max <= 1 (the bound planners rely on).
  The token sampled at the end of prefill is not taken off the decode work (one token per
  request, conservative).
- GPU duty cycle saturates with a small batch: 100 % with ``saturating_batch`` or more
  running requests, proportionally below; 0 when idle (so utilization cannot tell a
  replica with 4 requests from one with 60 - the reason queue signals exist).
- A new replica is billed from the instant it is created and serves after its own cold
  start counted from that same instant: a seeded draw in ``cold_start_spread`` whose mean
  is ``cold_start_s`` (image pull, weights load, CUDA graph capture), so replicas created
  together do not all come up together (``models.cold_start``).
- A removed replica drains, as a pod does on SIGTERM behind a Service: it takes no new
  requests, finishes the ones it runs, and goes away when done or after ``drain_s``
  (terminationGracePeriodSeconds; 30 s is Kubernetes' default), billed until then. Requests
  still running at the deadline go back to the front of the queue and start over.
- Requests wait in one shared queue and go, oldest first, to the ready replica with the
  fewest running requests (a gateway balancing on outstanding requests).
- Each replica counts what vLLM's /metrics would: prompt tokens prefilled, generation
  tokens decoded and requests finished, cumulative since it started.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpuscale.models.cold_start import Slots, draw
from gpuscale.telemetry.catalog import CATALOG
from gpuscale.traffic.trace import TraceRequest

# -- the model: Llama-3.1-8B (Hugging Face config.json: 32 layers, 8 KV heads of dim 128 -
#    grouped-query attention -, 8.03e9 parameters), bf16 weights and KV cache.
_PARAMS = 8.03e9
_WEIGHTS_MIB = _PARAMS * 2 / 2**20  # 2 bytes each: 15,316 MiB
# K and V, per layer, per KV head, per dim, 2 bytes: 2 x 32 x 8 x 128 x 2 = 131,072 B
# = 128 KiB per token, i.e. 8 tokens per MiB.
_KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2
# vLLM's default --gpu-memory-utilization is 0.9 (vLLM engine arguments docs); of that,
# the weights and ~1 GiB of activations/CUDA graphs (vLLM's profiling run) are not KV.
_GPU_MEMORY_UTILIZATION = 0.9
_ACTIVATION_MIB = 1024.0
# Prefill is compute bound: ~2 FLOPs per parameter per token (Kaplan et al. 2020,
# "Scaling Laws for Neural Language Models"), at ~40 % of the dense bf16 peak (model FLOPs
# utilization typical of large-batch transformer inference, e.g. the PaLM inference paper,
# Pope et al. 2022).
_PREFILL_MFU = 0.4


def kv_capacity_tokens(gpu_memory_mib: float) -> int:
    """KV-cache tokens that fit on one GPU: (memory x 0.9 - weights - activations) / 128 KiB.

    H100 80 GB (81,559 MiB per nvidia-smi):
    (73,403 - 15,316 - 1,024) MiB x 8 tokens/MiB = 456,504 tokens."""
    free_mib = gpu_memory_mib * _GPU_MEMORY_UTILIZATION - _WEIGHTS_MIB - _ACTIVATION_MIB
    return max(0, int(free_mib * 2**20 / _KV_BYTES_PER_TOKEN))


def prefill_tokens_per_s(dense_bf16_tflops: float) -> float:
    """Prompt tokens/s one GPU prefills: peak x MFU / (2 x parameters).

    H100 SXM (989 TFLOPS dense bf16): 989e12 x 0.4 / 16.06e9 = ~24,600."""
    return dense_bf16_tflops * 1e12 * _PREFILL_MFU / (2 * _PARAMS)


@dataclass(frozen=True, slots=True)
class ServingParams:
    """One replica's capacity (units in the names: tokens, tokens/s, seconds).

    ``cold_start_s`` is the mean cold start, what planners provision ahead by; each replica
    draws its own from ``cold_start_spread`` = (lo, hi) with that mean, seeded by
    ``cold_start_seed`` and the replica's number - or, with ``cold_start_slot_s``, the
    moment it was created (``models.cold_start``)."""

    max_batch: int = 256  # vLLM's default max_num_seqs (vLLM engine arguments docs)
    kv_tokens: int = kv_capacity_tokens(CATALOG["H100-SXM5-80GB"].memory_mib)  # 456,504
    prefill_tps: float = prefill_tokens_per_s(989.0)  # NVIDIA H100 SXM datasheet
    # ~20 ms per output token for a sequence in a large batch (vLLM v0.6.0 performance
    # update, blog.vllm.ai 2024-09-05: Llama 3 8B on one H100, TPOT in the tens of ms
    # before and a few ms after at 32 QPS; loaded replicas sit in between).
    decode_tps_per_seq: float = 50.0
    # The batch's aggregate is memory-bandwidth bound: about 12,000 output tokens/s for
    # an 8B model on one H100 at full batch (the order of vLLM's own serving benchmarks
    # for Llama 3 8B on 1xH100, same blog post).
    decode_tps_max: float = 12_000.0
    saturating_batch: int = 4
    # Image pull (the vllm-openai image is several GB), weights load (16 GB) and CUDA
    # graph capture / torch.compile: vLLM's docs (optimization levels) trade startup time
    # against speed; 80-300 s is the range of a cached vs. uncached start.
    cold_start_s: float = 150.0
    drain_s: float = 30.0
    cold_start_spread: tuple[float, float] = (80.0, 300.0)
    cold_start_seed: int = 0
    cold_start_slot_s: float = 0.0

    def cold_start(self, replica: int) -> float:
        """Draw number ``replica``'s cold start, seconds (``models.cold_start.draw``)."""
        return draw(self.cold_start_spread, self.cold_start_s, self.cold_start_seed, replica)


def _per_gpu(gpu: str, dense_bf16_tflops: float, bandwidth_tb_s: float,
             per_seq: float) -> ServingParams:
    # Decode is memory-bandwidth bound: the batch's aggregate scales the H100 figure
    # (3.35 TB/s) by bandwidth. ``per_seq``: every decode step reads the 16 GB of weights,
    # a floor of 16 GB / bandwidth per token (A100: 7.9 ms, L4: 53 ms) plus the batch's
    # attention, so ~1/3 of the H100's 50 tokens/s on an L4 rather than the bandwidth ratio.
    return ServingParams(kv_tokens=kv_capacity_tokens(CATALOG[gpu].memory_mib),
                         prefill_tps=prefill_tokens_per_s(dense_bf16_tflops),
                         decode_tps_per_seq=per_seq,
                         decode_tps_max=12_000.0 * bandwidth_tb_s / 3.35)


# Peak dense bf16 TFLOPS and memory bandwidth from NVIDIA's datasheets: H100 SXM 989 /
# 3.35 TB/s, A100 80GB SXM 312 / 2.04 TB/s, L4 121 / 0.3 TB/s (the datasheets' headline
# figures with sparsity are twice the dense ones). L4 fits the 16 GB of weights with
# ~35k tokens of KV cache left.
# AMD Instinct MI300X, AMD's datasheet: 1307.4 TFLOPS peak dense FP16/BF16, 5.3 TB/s HBM3,
# 192 GB; per-sequence decode scaled from the H100's by bandwidth, as the A100's is. That
# vLLM on ROCm reaches the same fraction of these peaks as on CUDA is assumed, not
# measured (no MI300X was available to this project).
GPU_TYPES: dict[str, ServingParams] = {
    "h100": ServingParams(),
    "a100": _per_gpu("A100-SXM4-80GB", 312.0, 2.04, per_seq=30.0),
    "l4": _per_gpu("L4", 121.0, 0.3, per_seq=15.0),
    "mi300x": _per_gpu("MI300X", 1307.4, 5.3, per_seq=79.0),
}
DEFAULT_GPU = "h100"


@dataclass(slots=True)
class InFlightRequest:
    arrival: float
    prompt: int
    output: int
    generated: float = 0.0
    prefilled: bool = False  # admitted: its prefill is scheduled (maybe not finished)
    first_token: float | None = None  # when its prefill ends
    admitted: float | None = None  # when its prefill starts (queue delay: - arrival)
    finished: float | None = None  # when its last token was decoded


@dataclass(slots=True)
class Replica:
    created: float
    ready_at: float
    running: list[InFlightRequest] = field(default_factory=list)
    removed_at: float | None = None  # draining since
    clock: float = 0.0  # busy with prefill until then
    prompt_tokens: float = 0.0  # prefilled, cumulative (vLLM: prompt_tokens_total)
    generation_tokens: float = 0.0  # decoded, cumulative (vLLM: generation_tokens_total)
    finished: int = 0  # requests completed (vLLM: request_success_total)
    number: int = 0  # the order of its creation (a pod's name)

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
    prompt_tokens_total: float = 0.0  # cumulative since the replica started
    generation_tokens_total: float = 0.0
    finished_total: float = 0.0


class ServingModel:
    def __init__(self, params: ServingParams = ServingParams(),
                 idlest_first: bool = False, round_robin: bool = False) -> None:
        """``idlest_first``: a scale-down removes, among Ready replicas, the one running the
        fewest requests (the pods carry ``controller.kubernetes.io/pod-deletion-cost`` from
        their running requests); otherwise the youngest, the ReplicaSet's default.
        ``round_robin``: requests go to the Ready replicas in turn (a Service's kube-proxy
        or a gateway that does not look at load), not to the one running the fewest."""
        self.p = params
        self.idlest_first = idlest_first
        self.round_robin = round_robin
        self._turn = 0  # round_robin: the replica whose turn it is
        self.cut = 0  # requests a drain's deadline cut off (they start over)
        self.replicas: list[Replica] = []  # the ones that take requests (or will)
        self.draining: list[Replica] = []  # removed, finishing what they run
        self.queue: deque[InFlightRequest] = deque()
        self.done: list[InFlightRequest] = []
        self.gpu_seconds = 0.0
        self.created = 0  # replicas ever created: numbers each one's cold-start draw
        self._slots = Slots(params.cold_start_slot_s)  # the cold starts' draw numbers

    def set_replicas(self, n: int, now: float, warm: bool = False) -> None:
        """Scale to ``n`` at time ``now``: new replicas are billed from ``now`` and serve
        after their cold start counted from ``now`` (``warm``: already running, for the
        replicas that exist when a simulation starts); removed ones drain from ``now``,
        picked as a ReplicaSet picks pods to delete: not Ready first (the youngest of them),
        then the lowest deletion cost (``idlest_first``: the fewest running requests), then
        the youngest."""
        while len(self.replicas) < n:
            ready = now if warm else now + self.p.cold_start(
                self._slots.number(now, self.created))
            self.created += 1
            self.replicas.append(Replica(now, ready, clock=ready, number=self.created - 1))
        while len(self.replicas) > n:
            gone = min(self.replicas, key=lambda rep: (
                now >= rep.ready_at, len(rep.running) if self.idlest_first else 0,
                -rep.number))
            # By identity: replicas are dataclasses, and two may compare equal by value.
            self.replicas = [rep for rep in self.replicas if rep is not gone]
            if gone.running:
                gone.removed_at = now
                self.draining.append(gone)

    def _end_drains(self, now: float) -> None:
        for rep in [d for d in self.draining if not d.running or
                    now - (d.removed_at or now) >= self.p.drain_s]:
            self.draining.remove(rep)
            self.cut += len(rep.running)
            for r in reversed(rep.running):  # cut off at the deadline: start over
                r.prefilled, r.generated = False, 0.0
                r.first_token = r.admitted = r.finished = None
                self.queue.appendleft(r)

    def arrive(self, requests: list[InFlightRequest]) -> None:
        self.queue.extend(requests)

    def step(self, now: float, dt: float) -> None:
        """Advance [now, now + dt): bill, admit waiting requests, prefill and decode."""
        end = now + dt
        self._end_drains(now)
        for rep in self.replicas + self.draining:  # billed from the instant created
            self.gpu_seconds += max(0.0, end - max(now, rep.created))
        ready = [rep for rep in self.replicas if now >= rep.ready_at]
        carried = {id(rep): min(max(0.0, rep.clock - now), dt) for rep in ready + self.draining}
        self._dispatch(ready, now, end)
        for rep in ready + self.draining:
            # Prefill time inside this step: what carried in plus what was scheduled here.
            busy = carried[id(rep)] + sum(
                max(0.0, min(r.first_token, end) - max(now, r.admitted))
                for r in rep.running
                if r.admitted is not None and r.first_token is not None
                and r.admitted >= now)
            busy = min(busy, dt)
            rep.prompt_tokens += busy * self.p.prefill_tps
            decoding = [r for r in rep.running
                        if r.first_token is not None and r.first_token < end]
            if not decoding:
                continue
            share = (dt - busy) / dt  # of every instant, what prefill leaves to decode
            per_seq = min(self.p.decode_tps_per_seq, self.p.decode_tps_max / len(decoding))
            for r in decoding:
                start = max(now, r.first_token or now)
                rate, left = per_seq * share, r.output - r.generated
                gained = min(rate * (end - start), left)
                if gained >= left:  # done inside the step, not at its end
                    r.finished = start + (left / rate if rate > 0 else 0.0)
                r.generated += gained
                rep.generation_tokens += gained
            finished = [r for r in decoding if r.generated >= r.output]
            if finished:
                gone = {id(r) for r in finished}
                rep.running = [r for r in rep.running if id(r) not in gone]
                rep.finished += len(finished)
                self.done.extend(finished)

    def _dispatch(self, ready: list[Replica], now: float, end: float) -> None:
        """Hand waiting requests, oldest first, to the ready replica with the fewest running
        (a gateway's least-outstanding-requests balancing; ties: the one free soonest)
        while its batch and its KV cache allow and its busy clock is inside this step - so a
        burst spreads over the replicas instead of piling prefills on one, as a scheduler
        with chunked prefill would. A request's prefill starts at the latest of the
        replica's clock, ``now`` and its arrival; the clock moves to where it ends (past
        ``end``: the next step starts late). A replica that cannot take the request at the
        head is done for this step."""
        if not self.queue or not ready:
            return
        if self.round_robin:
            self._dispatch_in_turn(ready, now, end)
            return
        p = self.p
        kv = [rep.kv_used() for rep in ready]
        heap = [(len(rep.running), rep.clock, i) for i, rep in enumerate(ready)
                if len(rep.running) < p.max_batch and rep.clock < end]
        heapq.heapify(heap)
        while self.queue and heap:
            n, _, i = heapq.heappop(heap)
            rep, nxt = ready[i], self.queue[0]
            if nxt.arrival >= end:
                break
            if kv[i] + nxt.prompt + nxt.output > p.kv_tokens and rep.running:
                continue
            self.queue.popleft()
            start = max(rep.clock, now, nxt.arrival)
            rep.clock = start + nxt.prompt / p.prefill_tps
            nxt.prefilled, nxt.admitted, nxt.first_token = True, start, rep.clock
            rep.running.append(nxt)
            kv[i] += nxt.prompt + nxt.output
            if n + 1 < p.max_batch and rep.clock < end:
                heapq.heappush(heap, (n + 1, rep.clock, i))

    def _dispatch_in_turn(self, ready: list[Replica], now: float, end: float) -> None:
        """Round-robin: the request at the head goes to the next Ready replica in turn,
        whatever it runs; a replica whose batch or KV cache is full (or whose clock is past
        this step) is skipped, and when none can take it the rest waits for the next step.
        Prefill timing as ``_dispatch``. One queue for all, as the least-loaded mode: a
        Service routes into each pod's own queue, so under saturation real pods can
        differ more than here."""
        p = self.p
        while self.queue and self.queue[0].arrival < end:
            nxt = self.queue[0]
            for k in range(len(ready)):
                i = (self._turn + k) % len(ready)
                rep = ready[i]
                if len(rep.running) >= p.max_batch or rep.clock >= end:
                    continue
                if rep.kv_used() + nxt.prompt + nxt.output > p.kv_tokens and rep.running:
                    continue
                break
            else:
                return
            self._turn = i + 1
            self.queue.popleft()
            start = max(rep.clock, now, nxt.arrival)
            rep.clock = start + nxt.prompt / p.prefill_tps
            nxt.prefilled, nxt.admitted, nxt.first_token = True, start, rep.clock
            rep.running.append(nxt)

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
                kv_cache=100.0 * rep.kv_used() / self.p.kv_tokens if up else 0.0,
                prompt_tokens_total=rep.prompt_tokens,
                generation_tokens_total=rep.generation_tokens,
                finished_total=float(rep.finished)))
        return out


def needed_replicas(requests: Sequence[TraceRequest], duration: float, params: ServingParams,
                    window_s: float = 60.0, busy: float = 0.8) -> list[int]:
    """Per second: replicas the next window's work needs at ``busy`` (one of the hindsight
    reference's starts, and the peak static provisioning searches from). A request costs
    a replica prompt/prefill_tps seconds of prefill and output/decode seconds of decode
    (at full batch: decode_tps_max, or max_batch x decode_tps_per_seq where the batch
    caps it first)."""
    decode = min(params.decode_tps_max, params.max_batch * params.decode_tps_per_seq)
    per_s = [0.0] * (int(duration) + 2)
    for r in requests:
        per_s[min(int(r.arrival_s), len(per_s) - 1)] += (
            r.input_tokens / params.prefill_tps + r.output_tokens / decode)
    out = []
    w = int(window_s)
    for t in range(len(per_s)):
        seconds_of_work = sum(per_s[t:t + w]) / w
        out.append(max(1, math.ceil(seconds_of_work / busy)))
    return out


def planner_metadata(params: ServingParams, slo_s: float = 2.0,
                     measure_startup: bool = False) -> dict[str, str]:
    """The trigger metadata a user who measured these replicas would write: start-up time
    (a high percentile of the cold starts, as docs/planner.md says to take; left out with
    ``measure_startup``: the planner then measures it from the pods), capacity, batch,
    the pods' termination grace, and the SLO."""
    startup = max(params.cold_start_s, params.cold_start_spread[1])
    md = {"ttftSeconds": f"{slo_s:.10g}", "startupSeconds": f"{startup:.10g}",
          "prefillTokensPerSecond": f"{params.prefill_tps:.10g}",
          "decodeTokensPerSecond": f"{params.decode_tps_max:.10g}",
          "maxBatch": str(params.max_batch), "drainSeconds": f"{params.drain_s:.10g}"}
    if measure_startup:
        del md["startupSeconds"]
    return md
