"""Signals (what can be measured per pod) and profiles (what to scale a kind of workload on).

A signal is a per-pod number with a unit. A profile picks one or more signals with a target
per pod and an activation threshold; with several, the HPA takes the largest desired count.
Every profile says why it uses what it uses.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Signal:
    name: str
    unit: str
    help: str
    engine: str = ""  # "" for GPU signals, else the engine that must be scraped

    @property
    def limit(self) -> float:
        """The largest per-pod value that can be true; a reading above it (or negative, or
        not finite) is a broken peer, not load, and makes the pod's value unusable."""
        return PLAUSIBLE[self.unit]


#: Per-pod plausibility bounds by unit: far above any real reading (a percentage is at most
#: 100; time-sliced process sums can overshoot a little), far below what overflows a sum
#: over a fleet or KEDA's 3-decimal quantities; never below what an agent may publish
#: (engines.signals.SIGNAL_BOUNDS).
PLAUSIBLE: dict[str, float] = {"%": 1_000.0, "MiB": 1e8, "requests": 10_000_000.0, "ms": 1e9,
                               "tokens/s": 1e8, "requests/s": 1e6, "replicas": 1_000_000.0}

#: The planner's output (profile vllm-planner): a workload's replica count, not a per-pod
#: signal; no other profile can use it.
PLANNED = "planned-replicas"


SIGNALS: dict[str, Signal] = {s.name: s for s in (
    Signal("gpu-utilization", "%", "attributed GPU kernel duty cycle, mean over the pod's "
           "GPUs or slices (100 = its GPUs fully busy)"),
    Signal("gpu-memory", "%", "attributed GPU memory used over the memory of the pod's "
           "devices"),
    Signal("gpu-memory-used", "MiB", "attributed GPU memory used on the pod's devices (whole "
           "GPUs, MIG instances, its processes' share of a time-sliced GPU)"),
    Signal("vllm-waiting", "requests", "vllm:num_requests_waiting, summed over engines",
           "vllm"),
    Signal("vllm-running", "requests", "vllm:num_requests_running, summed over engines",
           "vllm"),
    Signal("vllm-requests", "requests", "requests in the server: vllm:num_requests_running "
           "+ vllm:num_requests_waiting, summed over engines", "vllm"),
    Signal("vllm-kv-cache", "%", "vllm:kv_cache_usage_perc (or the older "
           "vllm:gpu_cache_usage_perc) x 100, the largest over engines", "vllm"),
    # Rates for the planner, not in the vllm-inference profile: throughput says what a pod
    # serves, not how much demand waits.
    Signal("vllm-prompt-tps", "tokens/s", "prompt (prefill) tokens per second: increase of "
           "vllm:prompt_tokens_total over the latest scrape interval, summed over engines",
           "vllm"),
    Signal("vllm-generation-tps", "tokens/s", "generated tokens per second: increase of "
           "vllm:generation_tokens_total over the latest scrape interval, summed over "
           "engines", "vllm"),
    Signal("vllm-finished-rate", "requests/s", "requests finished per second: increase of "
           "vllm:request_success_total (every finished_reason) over the latest scrape "
           "interval, summed over engines", "vllm"),
    Signal("triton-pending", "requests", "nv_inference_pending_request_count, summed over "
           "models", "triton"),
    Signal("triton-queue-time", "ms", "mean queue time per request over the last window, "
           "from nv_inference_queue_duration_us / nv_inference_request_success", "triton"),
    Signal("tgi-queue", "requests", "tgi_queue_size", "tgi"),
    Signal("tgi-batch", "requests", "tgi_batch_current_size", "tgi"),
    Signal(PLANNED, "replicas", "the planner's replica count for the whole workload (profile "
           "vllm-planner only; from the vllm token and request rates, queue and KV cache)",
           "vllm"),
)}


class ValueMode(enum.StrEnum):
    """How per-pod values become the workload's: SUM for KEDA's AverageValue target (the
    HPA divides by the target), AVERAGE for a Value target (the HPA multiplies by the
    ready pods)."""

    SUM = "sum"
    AVERAGE = "average"


class ProfileName(enum.StrEnum):
    GPU_UTILIZATION = "gpu-utilization"
    VLLM_INFERENCE = "vllm-inference"
    TRITON_INFERENCE = "triton-inference"
    TGI_INFERENCE = "tgi-inference"
    VLLM_PLANNER = "vllm-planner"
    TRAINING = "training"
    BATCH = "batch"


@dataclass(frozen=True, slots=True)
class Target:
    signal: str
    target: float  # per pod, in the signal's unit
    activation: float  # IsActive is true when the signal is strictly above this


@dataclass(frozen=True, slots=True)
class Profile:
    name: ProfileName
    targets: tuple[Target, ...]
    why: str


PROFILES: dict[ProfileName, Profile] = {p.name: p for p in (
    Profile(ProfileName.GPU_UTILIZATION, (Target("gpu-utilization", 70.0, 5.0),),
            "Generic GPU work whose throughput tracks kernel duty cycle. 70 % leaves headroom "
            "for bursts; duty cycle saturates early, so higher targets react late."),
    Profile(ProfileName.VLLM_INFERENCE, (Target("vllm-requests", 32.0, 0.0),
                               Target("vllm-kv-cache", 80.0, 0.0)),
            "vLLM pre-allocates ~90 % of GPU memory and keeps kernels busy with a small batch, "
            "so memory % and duty cycle do not move with load. Requests in the server "
            "(running + waiting) over a per-pod target is the concurrency a pod can carry: "
            "set it to ~50 % of the sequences your engine batches well (32 of 64), which "
            "leaves room for the load that arrives during a sync and a cold start; KV-cache "
            "usage near full means the batch cannot grow. Scale on whichever needs more "
            "pods. (Measured in BENCHMARKS.md: 75 % of the batch misses the SLO in more "
            "minutes; waiting requests alone overshoot while new replicas load the model.)"),
    Profile(ProfileName.VLLM_PLANNER, (Target(PLANNED, 1.0, 0.0),),
            "LLM serving where a new replica takes minutes to start: the planner (scaler."
            "planner) turns the engines' token rates, queue and KV cache into the replicas "
            "the workload needs now and for the bursts it had in the last 15 minutes, held "
            "for a start-up time, so capacity is there before the queue grows. The value is "
            "planned replicas x targetValue (AverageValue). Give it your SLO and start-up "
            "time (ttftSeconds or queueDelaySeconds, startupSeconds) and, once measured, "
            "your replica's capacity (prefillTokensPerSecond, decodeTokensPerSecond)."),
    Profile(ProfileName.TRITON_INFERENCE, (Target("triton-pending", 10.0, 0.0),
                                 Target("triton-queue-time", 50.0, 0.0)),
            "Triton's pending requests and the time requests wait in its queue are direct "
            "measures of unserved demand; GPU duty cycle depends on the model mix."),
    Profile(ProfileName.TGI_INFERENCE, (Target("tgi-queue", 5.0, 0.0),),
            "TGI's queue size counts requests not yet batched: the same reasoning as vLLM."),
    Profile(ProfileName.TRAINING, (Target("gpu-utilization", 85.0, 10.0),),
            "Training keeps GPUs saturated; scale data-parallel workers (or jobs) while they "
            "are busy, and let idle ones (data stalls, finished epochs) go."),
    Profile(ProfileName.BATCH, (Target("gpu-utilization", 80.0, 1.0),),
            "Batch workers: scale out while busy, to zero when nothing runs. Pair with a "
            "demandSource (a queue) so work waiting with no pods wakes them."),
)}
