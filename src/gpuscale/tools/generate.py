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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuscale.common.errors import ConfigError
from gpuscale.scaler.core.profiles import PLANNED, ProfileName
from gpuscale.scaler.core.profiles import PROFILES as PROFILE_TABLE
from gpuscale.scaler.core.trigger import parse_metadata

ENGINE_PORTS = {"vllm": 8000, "triton": 8002, "tgi": 80}  # where each serves /metrics
PROFILES = {"vllm": "vllm-inference", "triton": "triton-inference", "tgi": "tgi-inference",
            "": "gpu-utilization"}
_IMAGES = (("vllm", "vllm"), ("tritonserver", "triton"),
           ("text-generation-inference", "tgi"))
DEFAULT_STARTUP_S = 180.0  # an LLM replica: image pull, weights, CUDA graphs
MAX_STARTUP_S = 1800.0  # the HPA API: a policy period at most 1,800 s, a window 3,600 s


@dataclass(frozen=True, slots=True)
class Workload:
    kind: str
    namespace: str
    name: str
    match_labels: Mapping[str, str]
    images: tuple[str, ...]
    commands: tuple[str, ...]  # command and args, all containers
    annotations: Mapping[str, str]  # the pod template's
    replicas: int
    gpus: bool
    gpu_count: int = 0  # the nvidia.com/gpu the containers request (0: none or not a count)
    argvs: tuple[tuple[str, ...], ...] = ()  # each container's command and args, in order
    grace_s: int | None = None  # the pods' terminationGracePeriodSeconds (None: not given)


#: Engine flags read, by engine: flag (and its short forms) -> the name it is kept under.
ENGINE_FLAGS = {
    "vllm": {"--max-num-seqs": "max_num_seqs", "--tensor-parallel-size": "tp", "-tp": "tp",
             "--pipeline-parallel-size": "pp", "-pp": "pp", "--port": "port"},
    "tgi": {"--port": "port"},
    "triton": {"--metrics-port": "port"},
}


def engine_flags(engine: str, argv: Sequence[str]) -> dict[str, int]:
    """The engine's flags among ``argv`` that are whole numbers (``--flag N`` or
    ``--flag=N``; the last one given wins, as argparse does). A flag whose value is not a
    positive integer (an environment variable, a typo) is left out: the default stands."""
    names = ENGINE_FLAGS.get(engine, {})
    out: dict[str, int] = {}
    for i, arg in enumerate(argv):
        flag, eq, value = arg.partition("=")
        if flag not in names:
            continue
        if not eq:
            value = argv[i + 1] if i + 1 < len(argv) else ""
        if value.isascii() and value.isdigit() and int(value) > 0:
            out[names[flag]] = int(value)
    return out


MAX_DRAIN_S = 86_400  # the trigger's bound on drainSeconds (scaler.core.trigger)


@dataclass(frozen=True, slots=True)
class Options:
    scaler_address: str = "gpuscale-scaler.gpuscale.svc:6000"
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
    notes: tuple[str, ...]  # what was chosen and why, and warnings


def _obj(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{what}: expected a mapping, got {type(value).__name__}")
    return value


def _list(value: Any, what: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConfigError(f"{what}: expected a list, got {type(value).__name__}")
    return value


def workload_from(doc: Any) -> Workload:
    """The parts of a Deployment or StatefulSet manifest this reads. ConfigError naming the
    field for anything else."""
    obj = _obj(doc, "the manifest")
    kind = obj.get("kind")
    if obj.get("apiVersion") != "apps/v1" or kind not in ("Deployment", "StatefulSet"):
        raise ConfigError(f"expected an apps/v1 Deployment or StatefulSet, got "
                          f"{obj.get('apiVersion')!r} {kind!r}")
    meta, spec = _obj(obj.get("metadata"), "metadata"), _obj(obj.get("spec"), "spec")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError("metadata.name: required")
    selector = _obj(spec.get("selector"), "spec.selector")
    labels = _obj(selector.get("matchLabels"), "spec.selector.matchLabels")
    if not labels or selector.get("matchExpressions"):
        raise ConfigError("spec.selector: only matchLabels selectors are turned into a "
                          "podSelector here; write podSelector by hand for expressions")
    template = _obj(spec.get("template"), "spec.template")
    pod = _obj(template.get("spec"), "spec.template.spec")
    containers = [_obj(c, "a container") for c in _list(pod.get("containers"),
                                                        "spec.template.spec.containers")]
    if not containers:
        raise ConfigError("spec.template.spec.containers: none")
    gpus = any(str(k).startswith(("nvidia.com/", "amd.com/"))
               for c in containers
               for part in ("limits", "requests")
               for k in _obj(_obj(c.get("resources"), "resources").get(part), part))
    limits = [_obj(_obj(c.get("resources"), "resources").get("limits"), "limits")
              for c in containers]
    counts = [lim.get(name) for lim in limits for name in ("nvidia.com/gpu", "amd.com/gpu")]
    gpu_count = sum(int(n) for n in counts
                    if isinstance(n, int | str) and str(n).isascii() and str(n).isdigit())
    replicas = spec.get("replicas", 1)
    grace = pod.get("terminationGracePeriodSeconds")
    return Workload(
        str(kind), str(meta.get("namespace") or ""), name,
        {str(k): str(v) for k, v in labels.items()},
        tuple(str(c.get("image", "")) for c in containers),
        tuple(str(a) for c in containers
              for a in (*_list(c.get("command"), "command"), *_list(c.get("args"), "args"))),
        {str(k): str(v) for k, v in
         _obj(_obj(template.get("metadata"), "spec.template.metadata").get("annotations"),
              "annotations").items()},
        replicas if isinstance(replicas, int) and replicas >= 0 else 1, gpus, gpu_count,
        tuple(tuple(str(a) for a in (*_list(c.get("command"), "command"),
                                     *_list(c.get("args"), "args"))) for c in containers),
        grace if isinstance(grace, int) and not isinstance(grace, bool) and grace >= 0
        else None)


def detect_engine(w: Workload) -> tuple[str, str]:
    """The engine and why: the annotation, else an image or command naming one."""
    declared = w.annotations.get("gpuscale.io/engine", "")
    if declared:
        if declared not in ENGINE_PORTS:
            raise ConfigError(f"gpuscale.io/engine: {declared!r} is not one of "
                              f"{', '.join(ENGINE_PORTS)}")
        return declared, "the pod template's gpuscale.io/engine annotation"
    for image in w.images:
        repo = image.rsplit("/", 1)[-1].split(":", 1)[0].split("@", 1)[0]
        for marker, engine in _IMAGES:
            if marker in repo:
                return engine, f"the image {image}"
    if _runs_vllm(w.commands):
        return "vllm", "its command runs vllm"
    return "", "no engine found in the images or commands"


def engine_argv(w: Workload, engine: str) -> tuple[str, ...]:
    """The engine container's command and args (its flags are read there, never a
    sidecar's): the container whose image names the engine, else (vLLM) whose command runs
    it, else the only container; () when it cannot be told."""
    for image, argv in zip(w.images, w.argvs, strict=False):
        repo = image.rsplit("/", 1)[-1].split(":", 1)[0].split("@", 1)[0]
        if any(marker in repo and e == engine for marker, e in _IMAGES):
            return argv
    if engine == "vllm":
        for argv in w.argvs:
            if _runs_vllm(argv):
                return argv
    return w.argvs[0] if len(w.argvs) == 1 else ()


def _runs_vllm(argv: tuple[str, ...]) -> bool:
    """``vllm serve ...``, ``python -m vllm.entrypoints...``: the program, not any argument
    that mentions vllm (a download directory)."""
    for i, arg in enumerate(argv):
        if i == 0 and not arg.startswith("-") and "=" not in arg and \
                arg.rsplit("/", 1)[-1] == "vllm":
            return True
        if arg == "-m" and i + 1 < len(argv) and argv[i + 1].split(".", 1)[0] == "vllm":
            return True
    return False


def behavior(startup_s: float, planner: bool = False) -> dict[str, Any]:
    """HPA behaviour for a replica that takes ``startup_s`` to become Ready. With the
    planner, scale-down has no window or step of its own: the planner holds its plan for
    a start-up already, and a window on top only bills idle replicas (docs/planner.md, and what
    the planner's benchmark runs)."""
    up = {"stabilizationWindowSeconds": 0, "selectPolicy": "Max", "policies": [
        {"type": "Percent", "value": 100, "periodSeconds": 15},
        {"type": "Pods", "value": 4, "periodSeconds": 15}]}
    if planner:
        return {"scaleUp": up, "scaleDown": {"stabilizationWindowSeconds": 0}}
    down_window = max(300, math.ceil(2 * startup_s))
    return {
        "scaleUp": up,
        "scaleDown": {"stabilizationWindowSeconds": down_window, "policies": [
            {"type": "Pods", "value": 1, "periodSeconds": max(60, math.ceil(startup_s))}]},
    }


def generate(w: Workload, opts: Options) -> Generated:
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
                          f"amd.com/ GPU, so "
                          f"the agents see no GPU pods of it and every answer would be "
                          f"UNAVAILABLE; gpuscale scales GPU workloads")
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
            notes.append(f"WARNING: the containers request {w.gpu_count} nvidia.com/gpu but "
                         f"the engine's parallelism needs {need}")
    source = "given" if opts.startup_s else "the default; measure yours: pod creation to Ready"
    if opts.planner:
        notes.append("scale-down: no HPA window (the planner holds its plan for a start-up "
                     "itself)")
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
    fallback = max(1, opts.min_replicas)
    max_replicas = opts.max_replicas
    if w.replicas > max_replicas:
        max_replicas = w.replicas
        notes.append(f"maxReplicaCount raised to the {w.replicas} replicas the manifest runs "
                     f"(--max {opts.max_replicas} would scale it down at once)")
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
        so["spec"]["fallback"] = {"failureThreshold": 3, "replicas": fallback,
                                  "behavior": "currentReplicasIfHigher"}
        notes.append(f"fallback: after more than 3 failures in a row (KEDA's polls and the "
                     f"HPA's reads both count; the scaler says UNAVAILABLE when data is "
                     f"missing) keep the current replicas, at least {fallback} (behavior "
                     "currentReplicasIfHigher needs KEDA 2.17 or later; --keda-version 2.16 "
                     "for older)")
    else:
        notes.append("fallback: none - before KEDA 2.17 a fallback sets a fixed replica "
                     "count, which would scale a loaded workload down while data is missing; "
                     "without one the HPA keeps the current replicas on an error")
    parse_metadata(metadata)  # what the scaler will accept, or a clear error now
    return Generated(engine, profile, so, _hpa(w, profile, opts, startup, metadata),
                     tuple(notes))


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
        metric: dict[str, Any] = {"name": f"gpuscale_{t.signal.replace('-', '_')}"}
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
            "metric": {"name": "gpuscale_demand_pending",
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
