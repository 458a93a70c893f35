"""ResourceSlices as DRA drivers publish them (resource.k8s.io/v1), for the test API server
(tests/peers/kubeapi.py, collection ``RESOURCESLICES``), with NVIDIA's driver's attribute
names (kubernetes-sigs/dra-driver-nvidia-gpu ``cmd/gpu-kubelet-plugin/deviceinfo.go``) and
AMD's (ROCm/k8s-gpu-dra-driver ``docs/driver-attributes.md``)."""

from __future__ import annotations

from typing import Any

NVIDIA = "gpu.nvidia.com"
AMD = "gpu.amd.com"
Attrs = dict[str, str | int | bool]


def nvidia_gpu(minor: int, uuid: str, product: str = "NVIDIA H100 80GB HBM3") -> tuple[str, Attrs]:
    """A whole GPU: ``gpu-<minor>``, ``type: gpu``, its ``uuid`` (and the usual others)."""
    return f"gpu-{minor}", {"type": "gpu", "uuid": uuid, "productName": product,
                            "brand": "Nvidia", "architecture": "Hopper",
                            "cudaComputeCapability": "9.0.0", "driverVersion": "580.65.6"}


def nvidia_mig(minor: int, parent: str, profile: str, profile_id: int, start: int,
               size: int, uuid: str = "") -> tuple[str, Attrs]:
    """A MIG device ``gpu-<minor>-mig-<profileId>-<start>-<size>``: ``type: mig``,
    ``parentUUID``, ``profile``; its own ``uuid`` only when it exists (static MIG)."""
    attrs: Attrs = {"type": "mig", "parentUUID": parent, "profile": profile,
                    "productName": "NVIDIA H100 80GB HBM3", "brand": "Nvidia"}
    if uuid:
        attrs["uuid"] = uuid
    return f"gpu-{minor}-mig-{profile_id}-{start}-{size}", attrs


def make_slice(name: str, node: str, driver: str, pool: str,
               devices: list[tuple[str, dict[str, str | int | bool]]], generation: int = 1,
               count: int = 1, uid: str = "") -> dict[str, Any]:
    """A ResourceSlice (resource.k8s.io/v1) as a DRA driver publishes it for a node's pool:
    devices as (name, attributes); a Python str is a ``string`` attribute (``version`` too
    on the wire: both are strings), an int ``int``, a bool ``bool``."""
    def value(v: str | int | bool) -> dict[str, Any]:
        return {"bool": v} if isinstance(v, bool) else {"int": v} if isinstance(v, int) \
            else {"string": v}

    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name, "uid": uid or f"uid-{name}"},
            "spec": {"driver": driver, "nodeName": node,
                     "pool": {"name": pool, "generation": generation,
                              "resourceSliceCount": count},
                     "devices": [{"name": n, "attributes": {k: value(v) for k, v in a.items()}}
                                 for n, a in devices]}}
