"""A fake DRA driver for the simulated nodes whose GPUs are DRA-managed (``NodeShape.dra``),
and the kubelet's reading of the claims it allocated.

What NVIDIA's DRA driver (kubernetes-sigs/dra-driver-nvidia-gpu) puts in the API for such a
node, cut to whole GPUs: one ResourceSlice (``resource.k8s.io/v1``) per node, its pool named
after the node, a device ``gpu-<index>`` per GPU with ``type: gpu``, ``uuid``,
``productName`` and ``index`` (the shapes of tests/peers/dra.py); and the driver's
DeviceClass ``gpu.nvidia.com``, a CEL selector on the driver and the type. The real
kube-scheduler allocates claims against the slice; the stand-in kubelet lists each
container's claims in PodResources' ``dynamic_resources`` from the claims' allocation
results (``container_claims``), as the real kubelet's ``GetDynamicResources`` does."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cluster.nodes import NodeShape
from gpuscale.telemetry.scenario import gpu_uuid, parse_scenario
from tests.peers.dra import NVIDIA, make_slice, nvidia_gpu

DRIVER = NVIDIA  # gpu.nvidia.com
DEVICE_CLASS = "gpu.nvidia.com"
SELECTOR = f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'gpu'"


def slice_name(shape: NodeShape) -> str:
    return f"{shape.name}-{DRIVER}"


def resource_slice(shape: NodeShape) -> dict[str, Any]:
    """The node's ResourceSlice: every GPU of the node's scenario, whole, in one pool."""
    spec = parse_scenario({"nodes": [{"name": shape.name, "gpus": list(shape.gpus)}]}).nodes[0]
    devices = []
    for gpu in spec.gpus:
        name, attrs = nvidia_gpu(gpu.index, gpu_uuid(shape.name, gpu.index))
        devices.append((name, {**attrs, "index": gpu.index}))  # index: older releases
    out = make_slice(slice_name(shape), shape.name, DRIVER, shape.name, devices)
    del out["metadata"]["uid"]  # the API server's to give
    return out


def device_class() -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": DEVICE_CLASS},
            "spec": {"selectors": [{"cel": {"expression": SELECTOR}}]}}


def driver_objects(shapes: tuple[NodeShape, ...]) -> list[dict[str, Any]]:
    """What the driver publishes: its DeviceClass and a slice per DRA node."""
    return [device_class(), *(resource_slice(s) for s in shapes if s.dra and s.gpus)]


def gpu_index(driver: str, pool: str, device: str, node: str) -> int | None:
    """The scenario GPU a device of this driver's node pool is (``gpu-<index>``)."""
    if driver != DRIVER or pool != node or not device.startswith("gpu-"):
        return None
    rest = device.removeprefix("gpu-")
    return int(rest) if rest.isdigit() else None


@dataclass(frozen=True, slots=True)
class Claimed:
    """One claim as a container lists it: its name and namespace and every allocated
    device (driver, pool, device)."""

    name: str
    namespace: str
    devices: tuple[tuple[str, str, str], ...]


ClaimIndex = Mapping[tuple[str, str], Mapping[str, Any]]  # (namespace, name) -> claim


def _claim_names(pod: Mapping[str, Any]) -> dict[str, str]:
    """The pod's claim entries -> the ResourceClaim's name (a shared claim by its name,
    a template's by the name the controller gave it in ``status.resourceClaimStatuses``)."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    generated = {str(s.get("name")): s.get("resourceClaimName")
                 for s in status.get("resourceClaimStatuses") or []}
    out: dict[str, str] = {}
    for entry in spec.get("resourceClaims") or []:
        name = str(entry.get("name"))
        claim = entry.get("resourceClaimName") or generated.get(name)
        if claim:
            out[name] = str(claim)
    return out


def container_claims(pod: Mapping[str, Any], claims: ClaimIndex
                     ) -> dict[str, list[Claimed]] | None:
    """container -> the claims it names, with the devices the scheduler allocated; None
    while a claim the pod names is not yet known or allocated (a real kubelet does not
    start the pod before it prepared them), {} for a pod without claims."""
    meta = pod.get("metadata") or {}
    namespace = str(meta.get("namespace", ""))
    names = _claim_names(pod)
    out: dict[str, list[Claimed]] = {}
    for c in (pod.get("spec") or {}).get("containers") or []:
        for ref in (c.get("resources") or {}).get("claims") or []:
            claim_name = names.get(str(ref.get("name")))
            claim = claims.get((namespace, claim_name or ""))
            results = (((claim or {}).get("status") or {}).get("allocation") or {}).get(
                "devices", {}).get("results")
            if claim_name is None or not results:
                return None
            devices = tuple((str(r.get("driver")), str(r.get("pool")), str(r.get("device")))
                            for r in results)
            out.setdefault(str(c.get("name")), []).append(
                Claimed(claim_name, namespace, devices))
    return out


def index_claims(items: list[Mapping[str, Any]]) -> dict[tuple[str, str], Mapping[str, Any]]:
    return {(str((c.get("metadata") or {}).get("namespace")),
             str((c.get("metadata") or {}).get("name"))): c for c in items}
