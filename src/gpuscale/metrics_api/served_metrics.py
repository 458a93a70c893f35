"""Every metric the custom metrics API serves: its name, what it is computed from, its unit.

Pod metrics carry the names existing HPAs, dashboards and prometheus-adapter rules use, so
an HPA written for the DCGM -> Prometheus -> adapter pipeline works unchanged: each is one
of the agent's per-pod signals times a scale (vLLM's KV cache is a fraction 0-1 on its
/metrics, a percentage in our signal; Triton's queue time is in microseconds there).

Object metrics (on Deployments and StatefulSets) are gpuscale's workload values: the SUM of
a signal over the workload's pods (use an ``AverageValue`` target, as with KEDA: desired =
ceil(sum / target)), the planner's replica count, and ``gpuscale_demand_pending``: 1 while
a demand source of the scaler's configuration (``metricLabelSelector:
demandSource=NAME``) shows pending work, else 0 - a value that needs no pod, so an HPA
that scales to zero (Kubernetes 1.37's HPAScaleToZero, ``minReplicas: 0``) wakes the
workload on it: with an ``AverageValue`` target of 1 the HPA asks ceil(1 / 1) = 1 replica
from zero.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuscale.scaler.core.profiles import PLANNED, SIGNALS


@dataclass(frozen=True, slots=True)
class PodMetric:
    name: str
    signal: str
    scale: float  # value = signal x scale
    unit: str
    help: str


DEMAND = "demand"  # ObjectMetric.signal of gpuscale_demand_pending
DEMAND_METRIC = "gpuscale_demand_pending"  # the demand source's Object metric


@dataclass(frozen=True, slots=True)
class ObjectMetric:
    name: str
    signal: str  # PLANNED: the planner's replicas; DEMAND: a demand source's pending work
    unit: str
    help: str


def _pod(names: tuple[str, ...], signal: str, scale: float, unit: str,
         help_: str) -> list[PodMetric]:
    return [PodMetric(n, signal, scale, unit, help_) for n in names]


_UTIL = "attributed GPU duty cycle, mean over the pod's GPUs or MIG slices, 0-100"
POD_METRICS: dict[str, PodMetric] = {m.name: m for m in (
    *_pod(("gpu_utilization", "pod_gpu_utilization", "DCGM_FI_DEV_GPU_UTIL"),
          "gpu-utilization", 1.0, "percent", _UTIL),
    *_pod(("gpu_memory_utilization",), "gpu-memory", 1.0, "percent",
          "attributed GPU memory used over the memory of the pod's devices, 0-100"),
    *_pod(("DCGM_FI_DEV_FB_USED", "gpu_memory_used"), "gpu-memory-used", 1.0, "MiB",
          "attributed GPU framebuffer memory used, summed over the pod's devices"),
    *_pod(("vllm:num_requests_waiting", "vllm_num_requests_waiting"), "vllm-waiting", 1.0,
          "requests", "requests waiting in vLLM's queue, summed over engines"),
    *_pod(("vllm:num_requests_running", "vllm_num_requests_running"), "vllm-running", 1.0,
          "requests", "requests in vLLM's running batch, summed over engines"),
    *_pod(("vllm:kv_cache_usage_perc", "vllm_kv_cache_usage_perc",
           "vllm:gpu_cache_usage_perc", "vllm_gpu_cache_usage_perc"), "vllm-kv-cache", 0.01,
          "fraction 0-1", "vLLM KV-cache usage, the largest over engines"),
    *_pod(("nv_inference_pending_request_count",), "triton-pending", 1.0, "requests",
          "Triton requests received and not yet executing, summed over models"),
    *_pod(("nv_inference_queue_duration_us", "avg_time_queue_us"), "triton-queue-time",
          1000.0, "microseconds per request",
          "mean time a Triton request waited in the queue over the last scrape window "
          "(increase of nv_inference_queue_duration_us / of nv_inference_request_success)"),
    *_pod(("tgi_queue_size",), "tgi-queue", 1.0, "requests", "TGI requests not yet batched"),
    *_pod(("tgi_batch_current_size",), "tgi-batch", 1.0, "requests", "TGI's current batch"),
)}

def object_metric_name(signal: str) -> str:
    """The Object metric an HPA's spec names for a signal: gpuscale_<signal, '_' for '-'>."""
    return f"gpuscale_{signal.replace('-', '_')}"


#: gpuscale_<signal>: the workload's sum; gpuscale_planned_replicas: the planner's answer.
OBJECT_METRICS: dict[str, ObjectMetric] = {
    **{object_metric_name(s.name): ObjectMetric(
        object_metric_name(s.name), s.name, s.unit,
        f"sum over the workload's pods: {s.help}")
       for s in SIGNALS.values() if s.name != PLANNED},
    object_metric_name(PLANNED): ObjectMetric(
        object_metric_name(PLANNED), PLANNED, "replicas",
        "the planner's replica count for the workload (vLLM); its settings come from the "
        "metric selector, e.g. ttftSeconds=2,startupSeconds=180"),
    DEMAND_METRIC: ObjectMetric(
        DEMAND_METRIC, DEMAND, "0 or 1",
        "1 while the demand source named by the metric selector (demandSource=NAME) shows "
        "pending work, else 0; needs no pod, so it wakes a workload at zero replicas"),
}

#: The object resources served, as the HPA's client names them (resource.group).
OBJECT_RESOURCES: dict[str, tuple[str, str]] = {
    "deployments.apps": ("apps/v1", "Deployment"),
    "statefulsets.apps": ("apps/v1", "StatefulSet"),
}
