"""The simulated nodes: kwok keeps their leases and status; they advertise the GPUs a real
device plugin would (whole GPUs, MIG instances, time-sliced replicas, AMD GPUs), or none
when a DRA driver manages them (``dra``: the GPUs are in a ResourceSlice, ``cluster.dra``),
and
each has a podCIDR of its own inside the cluster's pod range, so the pods kwok starts on
it get addresses a stand-in process can listen on."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cluster.layout import Layout
from gpuscale.telemetry.model import SharingMode
from gpuscale.telemetry.scenario import gpu_uuid, mig_uuid, parse_scenario

SIMULATED_LABEL = "gpuscale.io/simulated"


@dataclass(frozen=True, slots=True)
class NodeShape:
    """A simulated node: its labels and the GPUs its agent simulates (a scenario's
    ``gpus`` list); the extended resources it advertises follow from those GPUs, as a
    device plugin's would (``devices``)."""

    name: str
    gpus: tuple[dict[str, Any], ...] = ()
    labels: dict[str, str] = field(default_factory=dict)
    replicas: int = 1  # time-slicing: each GPU advertised this many times
    amd: bool = False  # AMD GPUs: amd.com/gpu, no simulated agent yet
    dra: bool = False  # NVIDIA's DRA driver publishes the GPUs, no device plugin runs


NVIDIA = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
H100 = "H100-SXM5-80GB"

DEFAULT_NODES: tuple[NodeShape, ...] = (
    NodeShape("kwok-system-0", labels={"node-role.gpuscale.io/system": "true"}),
    NodeShape("kwok-gpu-0", ({"model": H100, "count": 8},), NVIDIA),
    NodeShape("kwok-gpu-1", ({"model": H100, "count": 8},), NVIDIA),
    NodeShape("kwok-mig-0", (
        {"model": H100, "count": 2, "sharing": "mig", "mig": ["3g.40gb", "3g.40gb"]},
        {"model": H100, "count": 2, "sharing": "mig", "mig": ["1g.10gb"] * 7}),
        {**NVIDIA, "nvidia.com/mig.strategy": "mixed"}),
    NodeShape("kwok-ts-0", ({"model": H100, "count": 4, "sharing": "time-sliced"},),
              {**NVIDIA, "nvidia.com/gpu.replicas": "4",
               "nvidia.com/gpu.sharing-strategy": "time-slicing"}, replicas=4),
    NodeShape("kwok-amd-0", ({"model": "MI300X", "count": 8},),
              {"amd.com/gpu.present": "true", "amd.com/gpu.product-name": "AMD_Instinct_MI300X"},
              amd=True),
    NodeShape("kwok-dra-0", ({"model": H100, "count": 8},),
              # the GPU operator's switch for a node whose GPUs its DRA driver serves
              {**NVIDIA, "nvidia.com/gpu.deploy.device-plugin": "false",
               "gpuscale.io/sim-dra": "true"}, dra=True),
)


def scenario(shape: NodeShape,
             processes: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The simulated-GPU scenario of the node's agent (``gpuscale agent --scenario``): the
    node's GPUs, and the processes of the pods that hold them (the agent follows the file
    as it is rewritten)."""
    return {"description": f"the GPUs of simulated node {shape.name}",
            "nodes": [{"name": shape.name, "gpus": list(shape.gpus),
                       "processes": processes or []}]}


def locations(shape: NodeShape) -> dict[str, tuple[int, int | None]]:
    """device ID -> (GPU index, MIG instance index or None): where a scenario process of
    the pod holding that device runs."""
    out: dict[str, tuple[int, int | None]] = {}
    for ids in devices(shape).values():
        for d in ids:
            out[d] = (-1, None)
    if not shape.gpus:
        return out
    spec = parse_scenario(scenario(shape)).nodes[0]
    for gpu in spec.gpus:
        uuid = gpu_uuid(shape.name, gpu.index)
        for k in range(len(gpu.mig)):
            out[mig_uuid(shape.name, gpu.index, k)] = (gpu.index, k)
        for d in out:
            if d == uuid or d.startswith(uuid + "::"):
                out[d] = (gpu.index, None)
    return out


def devices(shape: NodeShape) -> dict[str, list[str]]:
    """resource name -> device IDs, as the NVIDIA (or AMD) device plugin advertises them:
    ``GPU-<uuid>``, ``GPU-<uuid>::<n>`` when time-sliced, ``MIG-<uuid>`` per instance;
    none on a DRA node."""
    out: dict[str, list[str]] = {}
    if not shape.gpus or shape.dra:
        return out
    spec = parse_scenario(scenario(shape)).nodes[0]
    for gpu in spec.gpus:
        uuid = gpu_uuid(shape.name, gpu.index)
        if shape.amd:
            out.setdefault("amd.com/gpu", []).append(uuid)
        elif gpu.mig:
            for k, profile in enumerate(gpu.mig):
                out.setdefault(f"nvidia.com/mig-{profile.name}", []).append(
                    mig_uuid(shape.name, gpu.index, k))
        elif gpu.sharing is SharingMode.TIME_SLICED:
            out.setdefault("nvidia.com/gpu", []).extend(
                f"{uuid}::{n}" for n in range(shape.replicas))
        else:
            out.setdefault("nvidia.com/gpu", []).append(uuid)
    return out


_BASE = {"cpu": "64", "memory": "512Gi", "pods": "110", "ephemeral-storage": "1Ti"}


def node_object(layout: Layout, index: int, shape: NodeShape) -> dict[str, Any]:
    """The Node as the API server stores it; kwok keeps its status' capacity."""
    resources = {**_BASE, **{r: str(len(ids)) for r, ids in devices(shape).items()}}
    cidr = layout.pod_cidr(index)
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": shape.name,
            "labels": {"kubernetes.io/hostname": shape.name, "kubernetes.io/os": "linux",
                       "kubernetes.io/arch": "amd64", "type": "kwok",
                       SIMULATED_LABEL: "true", **shape.labels},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                            "kwok.x-k8s.io/node": "fake"},
        },
        "spec": {"podCIDR": cidr, "podCIDRs": [cidr]},
        "status": {"capacity": resources, "allocatable": resources},
    }


def node_objects(layout: Layout,
                 shapes: tuple[NodeShape, ...] = DEFAULT_NODES) -> list[dict[str, Any]]:
    return [node_object(layout, i, s) for i, s in enumerate(shapes)]


def kwok_argv(bin_dir: str, layout: Layout, stages: str) -> list[str]:
    return [f"{bin_dir}/kwok", f"--kubeconfig={layout.kubeconfig}",
            f"--manage-nodes-with-label-selector={SIMULATED_LABEL}=true",
            f"--config={stages}", "--node-lease-duration-seconds=40",
            f"--node-ip={layout.ns_ip}",
            # Nodes without a podCIDR take pod IPs from here: still inside the pod range.
            f"--cidr=198.19.{layout.slot * 64 + 63}.0/24",
            "--server-address=127.0.0.1:10247"]
