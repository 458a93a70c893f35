"""Simulated fleets described in YAML: nodes, GPUs, MIG layouts, sharing, processes and load.

A scenario is validated whole when loaded; any problem raises ``ScenarioError`` whose message
names the path of the offending key (``nodes[0].processes[2].gpu``) and what is allowed.

Schema (every key not marked optional is required)::

    description: str                      # optional
    nodes:                                # 1..1000
      - name: str                         # Kubernetes node name
        gpus:                             # groups of identical GPUs, indexed in order
          - model: H100-SXM5-80GB         # a key of gpuscale.telemetry.catalog.CATALOG
            count: 8                      # optional, default 1
            sharing: exclusive            # optional: exclusive | time-sliced | mps | mig
            mig: [3g.40gb, 2g.20gb]       # with sharing: mig, the instances in order
        processes:                        # optional
          - gpu: 0                        # GPU index on the node
            mig: 1                        # optional: index into that GPU's MIG layout
            pid: 4242                     # optional, default 1000 + position
            memory: 0.9                   # fraction of the GPU's (or instance's) memory,
            memory_mib: 70000             #   or MiB; one of the two, default 0
            load: {constant: 40}          # or {sine: {base, amplitude, period_s, phase_s}}
                                          # or {steps: [[t, value], ...], repeat_s: 600}
                                          # or {trace: {path, capacity_tokens_per_s,
                                          #      window_s, speedup, share}}
            pod: {namespace: ns, name: p, container: c,   # optional, for attribution
                  engine: vllm}                   # optional: simulated engine metrics
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpuscale.common.errors import ConfigError
from gpuscale.telemetry.catalog import CATALOG, MIG_SLICES, GpuModel, MigProfile
from gpuscale.telemetry.load import Constant, LoadCurve, Sine, Steps, trace_load
from gpuscale.telemetry.model import SharingMode
from gpuscale.traffic.trace import TraceError, read_trace

MAX_SCENARIO_BYTES = 4 * 1024 * 1024
MAX_NODES = 1000
MAX_GPUS_PER_NODE = 64
MAX_PROCESSES_PER_NODE = 4096


_UUID_NS = uuid.UUID("6f1c2d4e-8a7b-4c3d-9e0f-112233445566")


def gpu_uuid(node: str, index: int) -> str:
    """The stable UUID of a scenario node's GPU, as NVML and the device plugin name it."""
    return f"GPU-{uuid.uuid5(_UUID_NS, f'{node}/gpu/{index}')}"


def mig_uuid(node: str, index: int, mig: int) -> str:
    """The stable UUID of a MIG instance of a scenario node's GPU."""
    return f"MIG-{uuid.uuid5(_UUID_NS, f'{node}/gpu/{index}/mig/{mig}')}"


class ScenarioError(ConfigError):
    """A scenario that cannot be used; the message names the key and what is allowed."""


@dataclass(frozen=True, slots=True)
class PodRef:
    namespace: str
    name: str
    container: str
    engine: str = ""  # "vllm" | "triton" | "tgi": the demo serves simulated engine metrics
    ip: str = ""  # fixed pod IP (the live demo's pods keep theirs while others come and go)
    port: int = 0  # fixed engine port (the live demo's, claimed free); 0: the sources choose
    ready: bool = True  # False: a pod still starting (the live demo's cold starts)


@dataclass(frozen=True, slots=True)
class ProcessSpec:
    pid: int
    gpu: int
    mig: int | None
    memory_mib: float
    load: LoadCurve
    pod: PodRef | None


@dataclass(frozen=True, slots=True)
class GpuSpec:
    index: int
    model: GpuModel
    sharing: SharingMode
    mig: tuple[MigProfile, ...]


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    gpus: tuple[GpuSpec, ...]
    processes: tuple[ProcessSpec, ...]


@dataclass(frozen=True, slots=True)
class Scenario:
    description: str
    nodes: tuple[NodeSpec, ...]

    def node(self, name: str | None) -> NodeSpec:
        """The named node, or the first one when ``name`` is None."""
        if name is None:
            return self.nodes[0]
        for n in self.nodes:
            if n.name == name:
                return n
        raise ScenarioError(f"no node {name!r}; nodes: {[n.name for n in self.nodes][:20]}")


SCENARIO_DIR = Path(__file__).parent / "scenarios"


def builtin_scenarios() -> dict[str, Path]:
    """Shipped scenarios by name (file stem)."""
    return {p.stem: p for p in sorted(SCENARIO_DIR.glob("*.yaml"))}


def load_scenario(ref: str | Path) -> Scenario:
    """Load a scenario from a file path, or by the name of a shipped one."""
    path = builtin_scenarios().get(str(ref)) or Path(ref)
    try:
        data = read_scenario_document(path)
    except OSError as exc:
        names = ", ".join(builtin_scenarios())
        raise ScenarioError(f"{ref}: cannot read ({exc.strerror}); shipped scenarios: "
                            f"{names}") from exc
    return parse_scenario(data, base_dir=path.parent)


def read_scenario_document(path: Path) -> object:
    """The decoded YAML of a scenario file, not yet validated. OSError when it cannot be
    read; ScenarioError when it is larger than MAX_SCENARIO_BYTES or not YAML."""
    with path.open("rb") as f:
        raw = f.read(MAX_SCENARIO_BYTES + 1)  # never more than the bound into memory
    if len(raw) > MAX_SCENARIO_BYTES:
        raise ScenarioError(f"{path}: larger than {MAX_SCENARIO_BYTES} bytes")
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{path}: not valid YAML: {exc}") from exc


def parse_scenario(data: object, base_dir: Path = Path()) -> Scenario:
    """Validate a decoded YAML document into a Scenario (relative trace paths from base_dir)."""
    top = _mapping(data, "scenario", required={"nodes"}, optional={"description"})
    description = _str(top.get("description", ""), "description", allow_empty=True)
    nodes_raw = _list(top["nodes"], "nodes", 1, MAX_NODES)
    nodes = tuple(_node(n, f"nodes[{i}]", base_dir) for i, n in enumerate(nodes_raw))
    names = [n.name for n in nodes]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ScenarioError(f"nodes: duplicate node names {sorted(dup)}")
    return Scenario(description, nodes)


def fit_processes(data: object, node: str, gpus: tuple[GpuSpec, ...], base_dir: Path = Path(),
                  ) -> tuple[tuple[ProcessSpec, ...], tuple[str, ...]]:
    """The processes of node ``node`` in a document ``parse_scenario`` accepted, validated
    against ``gpus`` instead of the document's own GPUs (a running simulation keeps the GPUs
    it started with). A process that does not fit them (no such GPU or MIG instance, MIG
    mode or not, more memory than there is) is left out; its problem is in the second tuple.
    Memory fractions are of the GPU (or instance) in ``gpus``."""
    top = _mapping(data, "scenario", required={"nodes"}, optional={"description"})
    for i, raw in enumerate(_list(top["nodes"], "nodes", 1, MAX_NODES)):
        m = _mapping(raw, f"nodes[{i}]", required={"name", "gpus"}, optional={"processes"})
        if m["name"] != node:
            continue
        kept: list[ProcessSpec] = []
        problems: list[str] = []
        rows = _list(m.get("processes", []), f"nodes[{i}].processes", 0,
                     MAX_PROCESSES_PER_NODE)
        for k, p in enumerate(rows):
            try:
                kept.append(_process(p, f"nodes[{i}].processes[{k}]", k, list(gpus),
                                     base_dir))
            except ScenarioError as exc:
                problems.append(str(exc))
        return tuple(kept), tuple(problems)
    raise ScenarioError(f"no node {node!r}")


def _node(data: object, where: str, base_dir: Path) -> NodeSpec:
    m = _mapping(data, where, required={"name", "gpus"}, optional={"processes"})
    name = _str(m["name"], f"{where}.name")
    gpus: list[GpuSpec] = []
    for gi, g in enumerate(_list(m["gpus"], f"{where}.gpus", 0, MAX_GPUS_PER_NODE)):
        gpus.extend(_gpu_group(g, f"{where}.gpus[{gi}]", len(gpus)))
    if len(gpus) > MAX_GPUS_PER_NODE:
        raise ScenarioError(f"{where}.gpus: more than {MAX_GPUS_PER_NODE} GPUs on one node")
    procs_raw = _list(m.get("processes", []), f"{where}.processes", 0, MAX_PROCESSES_PER_NODE)
    procs = tuple(_process(p, f"{where}.processes[{i}]", i, gpus, base_dir)
                  for i, p in enumerate(procs_raw))
    pids = [p.pid for p in procs]
    if len(set(pids)) != len(pids):
        raise ScenarioError(f"{where}.processes: duplicate pids")
    return NodeSpec(name, tuple(gpus), procs)


def _gpu_group(data: object, where: str, first_index: int) -> list[GpuSpec]:
    m = _mapping(data, where, required={"model"}, optional={"count", "sharing", "mig"})
    key = _str(m["model"], f"{where}.model")
    model = CATALOG.get(key)
    if model is None:
        raise ScenarioError(f"{where}.model: unknown GPU model {key!r}; known: "
                            f"{sorted(CATALOG)}")
    count = _int(m.get("count", 1), f"{where}.count", 1, MAX_GPUS_PER_NODE)
    modes = {s.value: s for s in SharingMode}
    sharing_raw = _str(m.get("sharing", "exclusive"), f"{where}.sharing")
    if sharing_raw not in modes:
        raise ScenarioError(f"{where}.sharing: {sharing_raw!r} is not one of {sorted(modes)}")
    sharing = modes[sharing_raw]
    layout: tuple[MigProfile, ...] = ()
    if sharing is SharingMode.MIG:
        if not model.mig_profiles:
            raise ScenarioError(f"{where}.sharing: {key} does not support MIG")
        names = _list(m.get("mig"), f"{where}.mig", 1, MIG_SLICES)
        profiles = []
        for i, n in enumerate(names):
            prof = model.profile(_str(n, f"{where}.mig[{i}]"))
            if prof is None:
                raise ScenarioError(f"{where}.mig[{i}]: {n!r} is not a MIG profile of {key}; "
                                    f"profiles: {[p.name for p in model.mig_profiles]}")
            profiles.append(prof)
        if sum(p.slices for p in profiles) > MIG_SLICES:
            raise ScenarioError(f"{where}.mig: the instances need more than {MIG_SLICES} "
                                f"slices")
        layout = tuple(profiles)
    elif "mig" in m:
        raise ScenarioError(f"{where}.mig: only allowed with sharing: mig")
    return [GpuSpec(first_index + i, model, sharing, layout) for i in range(count)]


def _process(data: object, where: str, pos: int, gpus: list[GpuSpec],
             base_dir: Path) -> ProcessSpec:
    m = _mapping(data, where, required={"gpu", "load"},
                 optional={"mig", "pid", "memory", "memory_mib", "pod"})
    gpu_idx = _int(m["gpu"], f"{where}.gpu", 0, MAX_GPUS_PER_NODE - 1)
    if gpu_idx >= len(gpus):
        raise ScenarioError(f"{where}.gpu: GPU {gpu_idx} does not exist (node has "
                            f"{len(gpus)})")
    gpu = gpus[gpu_idx]
    mig: int | None = None
    capacity_mib: float = gpu.model.memory_mib
    if "mig" in m:
        mig = _int(m["mig"], f"{where}.mig", 0, MIG_SLICES - 1)
        if mig >= len(gpu.mig):
            raise ScenarioError(f"{where}.mig: GPU {gpu_idx} has {len(gpu.mig)} MIG instances")
        capacity_mib = gpu.mig[mig].memory_mib
    elif gpu.sharing is SharingMode.MIG:
        raise ScenarioError(f"{where}.mig: GPU {gpu_idx} is in MIG mode; name the instance")
    if "memory" in m and "memory_mib" in m:
        raise ScenarioError(f"{where}: give memory (fraction) or memory_mib, not both")
    memory_mib = 0.0
    if "memory" in m:
        memory_mib = _num(m["memory"], f"{where}.memory", 0.0, 1.0) * capacity_mib
    elif "memory_mib" in m:
        memory_mib = _num(m["memory_mib"], f"{where}.memory_mib", 0.0, capacity_mib)
    pid = _int(m.get("pid", 1000 + pos), f"{where}.pid", 1, 2**22)
    pod = None
    if "pod" in m:
        pm = _mapping(m["pod"], f"{where}.pod", required={"namespace", "name"},
                      optional={"container", "engine"})
        engine = _str(pm.get("engine", "none"), f"{where}.pod.engine")
        if engine not in ("none", "vllm", "triton", "tgi"):
            raise ScenarioError(f"{where}.pod.engine: {engine!r} is not one of vllm, triton, "
                                f"tgi")
        pod = PodRef(_str(pm["namespace"], f"{where}.pod.namespace"),
                     _str(pm["name"], f"{where}.pod.name"),
                     _str(pm.get("container", "main"), f"{where}.pod.container"),
                     "" if engine == "none" else engine)
    return ProcessSpec(pid, gpu_idx, mig, memory_mib, _load(m["load"], f"{where}.load",
                                                              base_dir), pod)


def _load(data: object, where: str, base_dir: Path) -> LoadCurve:
    kinds = {"constant", "sine", "steps", "trace"}
    m = _mapping(data, where, required=set(), optional=kinds | {"repeat_s"})
    chosen = kinds & set(m)
    if len(chosen) != 1:
        raise ScenarioError(f"{where}: give exactly one of {sorted(kinds)}")
    kind = chosen.pop()
    if kind != "steps" and "repeat_s" in m:
        raise ScenarioError(f"{where}.repeat_s: only allowed with steps")
    value = m[kind]
    w = f"{where}.{kind}"
    if kind == "constant":
        return Constant(_num(value, w, 0.0, 100.0))
    if kind == "sine":
        s = _mapping(value, w, required={"base", "amplitude", "period_s"}, optional={"phase_s"})
        return Sine(_num(s["base"], f"{w}.base", 0.0, 100.0),
                    _num(s["amplitude"], f"{w}.amplitude", 0.0, 100.0),
                    _num(s["period_s"], f"{w}.period_s", 1e-3, 1e9),
                    _num(s.get("phase_s", 0.0), f"{w}.phase_s", -1e9, 1e9))
    if kind == "steps":
        rows = _list(value, w, 1, 10_000)
        starts: list[float] = []
        values: list[float] = []
        for i, row in enumerate(rows):
            pair = _list(row, f"{w}[{i}]", 2, 2)
            start = _num(pair[0], f"{w}[{i}][0]", 0.0, 1e9)
            if starts and start <= starts[-1]:
                raise ScenarioError(f"{w}[{i}][0]: step times must increase")
            starts.append(start)
            values.append(_num(pair[1], f"{w}[{i}][1]", 0.0, 100.0))
        repeat = m.get("repeat_s")
        rep = None if repeat is None else _num(repeat, f"{where}.repeat_s", 1e-3, 1e9)
        return Steps(tuple(starts), tuple(values), rep)
    t = _mapping(value, w, required={"path", "capacity_tokens_per_s"},
                 optional={"window_s", "speedup", "share"})
    path = Path(_str(t["path"], f"{w}.path"))
    try:
        requests = read_trace(path if path.is_absolute() else base_dir / path)
    except TraceError as exc:
        raise ScenarioError(f"{w}.path: {exc}") from exc
    return trace_load(requests, _num(t["capacity_tokens_per_s"], f"{w}.capacity_tokens_per_s",
                                     1e-6, 1e12),
                      _num(t.get("window_s", 10.0), f"{w}.window_s", 0.1, 86400.0),
                      _num(t.get("speedup", 1.0), f"{w}.speedup", 1e-3, 1e6),
                      _num(t.get("share", 1.0), f"{w}.share", 0.0, 1.0))


# -- small validators -------------------------------------------------------------------

def _mapping(data: object, where: str, required: set[str],
             optional: set[str]) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise ScenarioError(f"{where}: expected a mapping, got {type(data).__name__}")
    keys = {k for k in data if isinstance(k, str)}
    if len(keys) != len(data):
        raise ScenarioError(f"{where}: keys must be strings")
    unknown = keys - required - optional
    if unknown:
        raise ScenarioError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: "
                            f"{sorted(required | optional)}")
    missing = required - keys
    if missing:
        raise ScenarioError(f"{where}: missing key(s) {sorted(missing)}")
    return data


def _list(data: object, where: str, lo: int, hi: int) -> list[Any]:
    if not isinstance(data, list):
        raise ScenarioError(f"{where}: expected a list, got {type(data).__name__}")
    if not lo <= len(data) <= hi:
        raise ScenarioError(f"{where}: expected {lo} to {hi} entries, got {len(data)}")
    return data


def _str(data: object, where: str, allow_empty: bool = False) -> str:
    if not isinstance(data, str) or (not data and not allow_empty) or len(data) > 1024:
        raise ScenarioError(f"{where}: expected a non-empty string (at most 1024 characters)")
    return data


def _num(data: object, where: str, lo: float, hi: float) -> float:
    if isinstance(data, bool) or not isinstance(data, int | float):
        raise ScenarioError(f"{where}: expected a number, got {type(data).__name__}")
    if not lo <= data <= hi:  # also rejects NaN
        raise ScenarioError(f"{where}: {data} is outside {lo}..{hi}")
    return float(data)


def _int(data: object, where: str, lo: int, hi: int) -> int:
    if isinstance(data, bool) or not isinstance(data, int):
        raise ScenarioError(f"{where}: expected an integer, got {type(data).__name__}")
    if not lo <= data <= hi:
        raise ScenarioError(f"{where}: {data} is outside {lo}..{hi}")
    return data
