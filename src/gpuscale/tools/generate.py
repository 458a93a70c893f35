"""A ScaledObject (and a plain HPA for the metrics API) that is right for a workload (pure).

From a Deployment or StatefulSet: the inference engine (the pod template's
``gpuscale.io/engine`` annotation, else its container images and commands), the profile
that engine needs, a fallback that holds the replicas there are when the scaler cannot
answer, scale-to-zero only with a demand source (pods at zero show no load, so nothing
else can wake them), and HPA behaviour from the workload's start-up time:

- scale up at once (no stabilization), doubling or +4 pods every 15 s, whichever is more
  (a slow start-up is no reason to ask later: the replicas take that long anyway);
- scale down only after a window of the longer of 5 minutes and two start-ups (a replica
  removed in a lull takes a start-up to come back; two start-ups of calm make that cheap),
  one replica per start-up time (at least a minute), so a falling load steps down instead
  of dropping to a cliff.

The engine's own flags are read from the containers' command and args: vLLM's
``--max-num-seqs`` (the planner's ``maxBatch``), ``--tensor-parallel-size`` and
``--pipeline-parallel-size`` (the GPUs one replica needs, checked against what the
container requests), and the port it serves ``/metrics`` on (vLLM's and TGI's
``--port``, Triton's ``--metrics-port``) for the annotation to add. With the planner the
HPA's scale-down has no window of its own: the planner holds its plan for a start-up.

What it cannot see it says: an engine the agent will not scrape (the pod template lacks
the opt-in annotations) is a warning with the two annotations to add. What would not work
it refuses (ConfigError: exit 2, one line): a workload that requests no GPU (the agents
see no GPU pods there, so every answer would be UNAVAILABLE), an option that would do
nothing (``ttft_s`` without the planner).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuscale.common.errors import ConfigError
from gpuscale.metrics_api.served_metrics import DEMAND_METRIC, object_metric_name
from gpuscale.models.planner_behavior import PLANNER_BEHAVIOR
from gpuscale.scaler.core.profiles import PLANNED, ProfileName
from gpuscale.scaler.core.profiles import PROFILES as PROFILE_TABLE
from gpuscale.scaler.core.trigger import parse_metadata
from gpuscale.tools.workload_manifest import (
    ENGINE_PORTS,
    Workload,
    detect_engine,
    engine_argv,
    engine_flags,
    workload_from,
)

# What reads the workload is imported from here by the CLI and the tests.
__all__ = ["Generated", "Options", "Workload", "behavior", "detect_engine", "engine_flags",
           "generate", "workload_from"]

PROFILES = {"vllm": "vllm-inference", "triton": "triton-inference", "tgi": "tgi-inference",
            "": "gpu-utilization"}
DEFAULT_STARTUP_S = 180.0  # an LLM replica: image pull, weights, CUDA graphs
MAX_STARTUP_S = 1800.0  # the HPA API: a policy period at most 1,800 s, a window 3,600 s
MAX_DRAIN_S = 86_400  # the trigger's bound on drainSeconds (scaler.core.trigger)
DEFAULT_SCALER_ADDRESS = "gpuscale-scaler.gpuscale.svc:6000"  # the Helm chart's Service


@dataclass(frozen=True, slots=True)
class Options:
    scaler_address: str = DEFAULT_SCALER_ADDRESS
    min_replicas: int = 1
    max_replicas: int = 8
    startup_s: float | None = None  # None: the default, said so in the output
    demand_source: str = ""
    planner: bool = False  # vLLM: plan ahead (profile vllm-planner)
    ttft_s: float | None = None
    keda_version: tuple[int, int] = (2, 17)  # fallback.behavior needs 2.17


@dataclass(frozen=True, slots=True)
class Generated:
    engine: str
    profile: str
    scaled_object: dict[str, Any]
    hpa: dict[str, Any]
    notes: tuple[str, ...]  # what was chosen and why, and warnings (for the ScaledObject)
    hpa_notes: tuple[str, ...] = ()  # the same for the HPA: without KEDA's fallback


def behavior(startup_s: float, planner: bool = False) -> dict[str, Any]:
    """HPA behaviour for a replica that takes ``startup_s`` to become Ready. With the
    planner, ``models.planner_behavior``'s: scale-down has no window or step of its own
    (the planner holds its plan for a start-up already, and a window on top only bills
    idle replicas), and no tolerance either way (its count is exact) - docs/planner.md,
    and what the planner's benchmark runs."""
    up = {"stabilizationWindowSeconds": 0, "selectPolicy": "Max", "policies": [
        {"type": "Percent", "value": 100, "periodSeconds": 15},
        {"type": "Pods", "value": 4, "periodSeconds": 15}]}
    if planner:
        return {"scaleUp": {**up, **PLANNER_BEHAVIOR["scaleUp"]},
                "scaleDown": dict(PLANNER_BEHAVIOR["scaleDown"])}
    down_window = max(300, math.ceil(2 * startup_s))
    return {
        "scaleUp": up,
        "scaleDown": {"stabilizationWindowSeconds": down_window, "policies": [
            {"type": "Pods", "value": 1, "periodSeconds": max(60, math.ceil(startup_s))}]},
    }


def generate(w: Workload, opts: Options) -> Generated:
    """The ScaledObject and HPA for ``w``, and notes on what was chosen and why.
    ConfigError (one line a person can act on) for what would not work."""
    startup = _startup(w, opts)
    engine, profile, flags, notes = _engine(w, opts)
    notes[1:1] = w.dra_notes  # where its GPUs come from, after the engine
    source = "given" if opts.startup_s else "the default; measure yours: pod creation to Ready"
    if opts.planner:
        notes.append("scale-down: no HPA window (the planner holds its plan for a start-up "
                     "itself); tolerance 0 both ways (its count is exact; Kubernetes 1.35 or "
                     "later, HPAConfigurableTolerance, and KEDA 2.18 or later - older ones "
                     "drop it and keep the 10 % band)")
    else:
        notes.append(f"start-up {startup:g} s ({source}): scale-down window "
                     f"{max(300, math.ceil(2 * startup))} s, one replica per "
                     f"{max(60, math.ceil(startup))} s")
    selector = ",".join(f"{k}={v}" for k, v in sorted(w.match_labels.items()))
    metadata: dict[str, str] = {"scalerAddress": opts.scaler_address, "profile": profile,
                                "podSelector": selector}
    if opts.demand_source:
        metadata["demandSource"] = opts.demand_source
    if opts.min_replicas == 0:
        notes.append(f"scale to zero: KEDA wakes the workload when {opts.demand_source} shows "
                     "pending work; the plain HPA (--hpa) does on gpuscale_demand_pending, "
                     "with minReplicas 0 - Kubernetes 1.37 or later (HPAScaleToZero)")
    if profile == "vllm-planner":
        _planner_settings(w, opts, flags, startup, metadata, notes)
    fallback = max(1, opts.min_replicas)
    max_replicas = opts.max_replicas
    if w.replicas > max_replicas:
        max_replicas = w.replicas
        notes.append(f"the maximum (maxReplicaCount, maxReplicas) raised to the {w.replicas} "
                     f"replicas the manifest runs (--max {opts.max_replicas} would scale it "
                     "down at once)")
    hpa_notes = tuple(notes)  # what follows is KEDA's alone
    so: dict[str, Any] = {
        "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
        "metadata": _meta(w),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": w.kind, "name": w.name},
            "minReplicaCount": opts.min_replicas, "maxReplicaCount": max_replicas,
            "triggers": [{"type": "external", "metadata": metadata}],
            "advanced": {"horizontalPodAutoscalerConfig": {
                "behavior": behavior(startup, profile == "vllm-planner")}},
        }}
    if opts.keda_version >= (2, 17):
        so["spec"]["fallback"] = _fallback(fallback, notes)
    else:
        notes.append("fallback: none - before KEDA 2.17 a fallback sets a fixed replica "
                     "count, which would scale a loaded workload down while data is missing; "
                     "without one the HPA keeps the current replicas on an error")
    parse_metadata(metadata)  # what the scaler will accept, or a clear error now
    return Generated(engine, profile, so, _hpa(w, profile, opts, startup, metadata),
                     tuple(notes), hpa_notes)


def _startup(w: Workload, opts: Options) -> float:
    """The start-up to plan the scale-down with; ConfigError for options that would not
    work together or a workload that is not a GPU workload."""
    if not 0 <= opts.min_replicas <= opts.max_replicas or opts.max_replicas < 1:
        raise ConfigError(f"replicas: need 0 <= min ({opts.min_replicas}) <= max "
                          f"({opts.max_replicas}) and max >= 1")
    if opts.min_replicas == 0 and not opts.demand_source:
        raise ConfigError("min 0 (scale to zero) needs a demand source: at zero replicas no "
                          "pod shows the load, so nothing would wake the workload; give "
                          "--demand-source NAME (the scaler's config) or keep min >= 1")
    startup = DEFAULT_STARTUP_S if opts.startup_s is None else opts.startup_s
    if not 0 < startup <= MAX_STARTUP_S:
        raise ConfigError(f"start-up: {startup:g} s is not between 0 and {MAX_STARTUP_S:g}")
    if opts.ttft_s is not None and not opts.planner:
        raise ConfigError("--ttft-seconds: only with --planner (the other profiles scale on "
                          "the engines' queues, not on an objective); add --planner or drop it")
    if not w.gpus:
        raise ConfigError(f"{w.kind} {w.name}: no container requests an nvidia.com/ or "
                          f"amd.com/ GPU or a DRA resource claim, so "
                          f"the agents see no GPU pods of it and every answer would be "
                          f"UNAVAILABLE; gpuscale scales GPU workloads")
    return startup


def _engine(w: Workload, opts: Options) -> tuple[str, str, dict[str, int], list[str]]:
    """(engine, profile, the engine's flags, notes): warnings for an engine the agent would
    not scrape, and the GPUs a replica needs."""
    engine, why = detect_engine(w)
    flags = engine_flags(engine, engine_argv(w, engine))
    port = flags.get("port", ENGINE_PORTS.get(engine, 0))
    profile = PROFILES[engine]
    notes = [f"engine: {engine or 'none'} ({why}); profile {profile}"]
    if opts.planner:
        if engine != "vllm":
            raise ConfigError("the planner (vllm-planner) needs a vLLM workload")
        profile = "vllm-planner"
        notes[0] = f"engine: vllm ({why}); profile vllm-planner (plans ahead)"
    if engine and "gpuscale.io/engine" not in w.annotations:
        notes.append(f"WARNING: the agent scrapes only pods that opt in: add to the pod "
                     f"template's annotations gpuscale.io/engine: {engine} and "
                     f"gpuscale.io/metrics-port: '{port}'"
                     + (" (its --port)" if "port" in flags and engine != "triton" else
                        " (its --metrics-port)" if "port" in flags else "")
                     + ", else every answer is UNAVAILABLE")
    elif engine and w.annotations.get("gpuscale.io/metrics-port", str(port)) != str(port):
        notes.append(f"WARNING: gpuscale.io/metrics-port is "
                     f"{w.annotations['gpuscale.io/metrics-port']!r} but the engine's flags "
                     f"serve on {port}: the agent would scrape the wrong port")
    if "tp" in flags or "pp" in flags:
        need = flags.get("tp", 1) * flags.get("pp", 1)
        notes.append(f"GPUs per replica: {need} (tensor-parallel {flags.get('tp', 1)} x "
                     f"pipeline-parallel {flags.get('pp', 1)})")
        if w.gpu_count and w.gpu_count != need:
            notes.append(f"WARNING: the containers request {w.gpu_count} GPUs but "
                         f"the engine's parallelism needs {need}")
    return engine, profile, flags, notes


def _planner_settings(w: Workload, opts: Options, flags: Mapping[str, int], startup: float,
                      metadata: dict[str, str], notes: list[str]) -> None:
    """The planner's trigger settings into ``metadata`` (what it reads from the engine's
    flags and the pods' grace), and a note for each it leaves to the scaler."""
    if "max_num_seqs" in flags:
        metadata["maxBatch"] = str(flags["max_num_seqs"])
        notes.append(f"maxBatch {flags['max_num_seqs']}: the engine's --max-num-seqs")
    if "tp" in flags or "pp" in flags:
        notes.append("capacity: prefillTokensPerSecond and decodeTokensPerSecond "
                     "default to an 8B model on one H100; measure one replica of "
                     "yours (docs/planner.md: measuring a replica's capacity) and add them")
    if opts.startup_s is not None:
        metadata["startupSeconds"] = f"{startup:g}"
    else:
        notes.append("planner start-up: not written - the scaler measures it from the "
                     "pods' creation to first Ready (the 90th percentile; 300 s until "
                     "three pods have shown theirs); --startup-seconds fixes it")
    if opts.ttft_s is not None:
        metadata["ttftSeconds"] = f"{opts.ttft_s:g}"
    if w.grace_s is not None:
        grace = min(w.grace_s, MAX_DRAIN_S)
        metadata["drainSeconds"] = str(grace)
        notes.append(f"drainSeconds {grace}: the pods' terminationGracePeriodSeconds"
                     + (f" ({w.grace_s}; the trigger takes at most {MAX_DRAIN_S})"
                        if grace != w.grace_s else "")
                     + " (a scale-down cuts the requests that outlive it; the engine "
                     "must drain on SIGTERM for the grace to help)")
    else:
        notes.append("drainSeconds: not written - the pods take Kubernetes' default "
                     "30 s grace; requests that run longer are cut by a scale-down "
                     "(docs/planner.md: long generations)")


def _fallback(replicas: int, notes: list[str]) -> dict[str, Any]:
    """KEDA 2.17's fallback that holds the current replicas (at least ``replicas``)."""
    notes.append(f"fallback: after more than 3 failures in a row (KEDA's polls and the "
                 f"HPA's reads both count; the scaler says UNAVAILABLE when data is "
                 f"missing) keep the current replicas, at least {replicas} (behavior "
                 "currentReplicasIfHigher needs KEDA 2.17 or later; --keda-version 2.16 "
                 "for older)")
    return {"failureThreshold": 3, "replicas": replicas,
            "behavior": "currentReplicasIfHigher"}


def _meta(w: Workload) -> dict[str, str]:
    """Name, and the namespace only when the manifest names one (else kubectl's -n)."""
    return {"name": w.name, **({"namespace": w.namespace} if w.namespace else {})}


def _hpa(w: Workload, profile: str, opts: Options, startup: float,
         planner: Mapping[str, str]) -> dict[str, Any]:
    """The profile's targets as Object metrics of the custom metrics API (the workload's
    sum, so AverageValue = per pod; the planner's replicas with its settings in the metric
    selector). With ``--min 0`` (a demand source given) ``minReplicas: 0`` and
    ``gpuscale_demand_pending`` of that source beside them: Kubernetes 1.37's HPA scales
    to zero on Object metrics, and that one wakes the workload (docs/hpa.md)."""
    def described() -> dict[str, str]:  # a copy each: YAML then needs no anchors
        return {"apiVersion": "apps/v1", "kind": w.kind, "name": w.name}

    metrics = []
    for t in PROFILE_TABLE[ProfileName(profile)].targets:
        metric: dict[str, Any] = {"name": object_metric_name(t.signal)}
        if t.signal == PLANNED:  # the trigger's planner settings, as the selector
            settings = {k: v for k, v in planner.items()
                        if k in ("startupSeconds", "ttftSeconds", "maxBatch", "drainSeconds")}
            if settings:
                metric["selector"] = {"matchLabels": settings}
        metrics.append({"type": "Object", "object": {
            "describedObject": described(), "metric": metric,
            "target": {"type": "AverageValue", "averageValue": f"{t.target:g}"}}})
    if opts.min_replicas == 0:  # (generate refuses min 0 without a demand source)
        metrics.append({"type": "Object", "object": {
            "describedObject": described(),
            "metric": {"name": DEMAND_METRIC,
                       "selector": {"matchLabels": {"demandSource": opts.demand_source}}},
            "target": {"type": "AverageValue", "averageValue": "1"}}})
    return {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": _meta(w),
        "spec": {
            "scaleTargetRef": described(),
            "minReplicas": opts.min_replicas,
            "maxReplicas": max(opts.max_replicas, w.replicas),
            "metrics": metrics, "behavior": behavior(startup, profile == "vllm-planner"),
        }}
