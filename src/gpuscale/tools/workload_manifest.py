"""What ``gpuscale generate`` reads of a workload (pure): the parts of its Deployment or
StatefulSet manifest it needs, the inference engine it runs (the pod template's
``gpuscale.io/engine`` annotation, else its container images and commands), and that
engine's own flags from the engine container's command and args."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuscale.common.errors import ConfigError
from gpuscale.tools.workload_claims import claim_gpus

ENGINE_PORTS = {"vllm": 8000, "triton": 8002, "tgi": 80}  # where each serves /metrics
_IMAGES = (("vllm", "vllm"), ("tritonserver", "triton"),
           ("text-generation-inference", "tgi"))


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
    dra_notes: tuple[str, ...] = ()  # how its DRA claims' GPUs were read (workload_claims)


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


def _obj(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{what}: expected a mapping, got {type(value).__name__}")
    return value


def _said(value: Any) -> str:
    """A value from the manifest, quoted and cut short, for a message."""
    return "none" if value is None else repr(value)[:60]


def _list(value: Any, what: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConfigError(f"{what}: expected a list, got {type(value).__name__}")
    return value


def workload_from(doc: Any, docs: Sequence[Any] = ()) -> Workload:
    """The parts of a Deployment or StatefulSet manifest this reads; ``docs``, the other
    objects of the manifest, give its DRA claims' requests. ConfigError naming the field
    for anything else."""
    obj = _obj(doc, "the manifest")
    kind, api = obj.get("kind"), obj.get("apiVersion")
    if kind not in ("Deployment", "StatefulSet"):
        raise ConfigError(f"kind: expected Deployment or StatefulSet, got {_said(kind)}")
    if api is None:
        raise ConfigError(f"apiVersion: missing; a {kind} needs apiVersion: apps/v1")
    if api != "apps/v1":
        raise ConfigError(f"apiVersion: {_said(api)}; a {kind} is apps/v1 (what "
                          f"Kubernetes serves since 1.16)")
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
    claims = claim_gpus(pod, containers, docs)
    gpu_count += claims.count or 0
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
        replicas if isinstance(replicas, int) and replicas >= 0 else 1,
        gpus or claims.uses_claims, gpu_count,
        tuple(tuple(str(a) for a in (*_list(c.get("command"), "command"),
                                     *_list(c.get("args"), "args"))) for c in containers),
        grace if isinstance(grace, int) and not isinstance(grace, bool) and grace >= 0
        else None, claims.notes)


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
