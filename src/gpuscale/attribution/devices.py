"""Device IDs and resource names of the NVIDIA and AMD device plugins, parsed strictly.

The AMD device plugin (ROCm/k8s-device-plugin, ``internal/pkg/amdgpu/amdgpu.go``
``GetAMDGPUs``) names a GPU by its PCI address (the amdgpu driver's device directory,
``0000:19:00.0``); on a partitioned GPU that address is its first partition, and every
other partition is named by its platform device (``amdgpu_xcp_<n>``, numbered across the
node). It offers them as ``amd.com/gpu``, or, on a node whose GPUs are partitioned
differently, as ``amd.com/<compute>_<memory>`` (``cpx_nps4``).
"""

from __future__ import annotations

import re

from gpuscale.attribution.model import DeviceKind, DeviceRef
from gpuscale.common.errors import PeerError

MAX_DEVICE_ID = 256

_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_REPLICA = r"(?:::(?P<replica>\d{1,6}))?"
_GPU = re.compile(rf"(?P<uuid>GPU-{_UUID}){_REPLICA}")
_MIG = re.compile(rf"(?P<uuid>MIG-{_UUID}){_REPLICA}")
_MIG_OLD = re.compile(rf"MIG-(?P<uuid>GPU-{_UUID})/(?P<gi>\d{{1,4}})/(?P<ci>\d{{1,4}}){_REPLICA}")

_PCI = re.compile(rf"(?P<bdf>[0-9a-fA-F]{{4}}:[0-9a-fA-F]{{2}}:[0-9a-fA-F]{{2}}\.[0-7]){_REPLICA}")
_XCP = re.compile(rf"(?P<name>amdgpu_xcp_\d{{1,5}}){_REPLICA}")

DEFAULT_RESOURCES = ("nvidia.com/gpu", "nvidia.com/gpu.shared", "amd.com/gpu")
_MIG_RESOURCE = re.compile(r"nvidia\.com/mig-(?:\d+c\.)?\d+g\.\d+gb(?:\.shared)?")
_AMD_PARTITION_RESOURCE = re.compile(r"amd\.com/(?:spx|dpx|tpx|qpx|cpx)_nps[1-8]")
VENDOR_PREFIXES = ("nvidia.com/", "amd.com/")  # resources of these vendors hold GPUs


class DeviceIdError(PeerError, ValueError):
    """A device ID in none of the forms the NVIDIA and AMD device plugins emit."""


def parse_device_id(raw: str) -> DeviceRef:
    """Parse one device ID; raises DeviceIdError naming the forms accepted."""
    if len(raw) > MAX_DEVICE_ID:
        raise DeviceIdError(f"device ID longer than {MAX_DEVICE_ID} characters")
    if m := _GPU.fullmatch(raw):
        return DeviceRef(raw, DeviceKind.GPU, m["uuid"], replica=_int(m["replica"]))
    if m := _MIG.fullmatch(raw):
        return DeviceRef(raw, DeviceKind.MIG, m["uuid"], replica=_int(m["replica"]))
    if m := _MIG_OLD.fullmatch(raw):
        return DeviceRef(raw, DeviceKind.MIG, m["uuid"], gpu_instance_id=int(m["gi"]),
                         compute_instance_id=int(m["ci"]), replica=_int(m["replica"]))
    if m := _PCI.fullmatch(raw):
        return DeviceRef(raw, DeviceKind.PCI, m["bdf"].lower(), replica=_int(m["replica"]))
    if m := _XCP.fullmatch(raw):
        return DeviceRef(raw, DeviceKind.PLATFORM, m["name"], replica=_int(m["replica"]))
    raise DeviceIdError(f"{raw[:80]!r} is not GPU-<uuid>, MIG-<uuid>, "
                        f"MIG-GPU-<uuid>/<gi>/<ci>, a PCI address dddd:bb:dd.f or "
                        f"amdgpu_xcp_<n> (each optionally ::<n>)")


def _int(v: str | None) -> int | None:
    return None if v is None else int(v)


def is_gpu_resource(name: str, extra: tuple[str, ...] = ()) -> bool:
    """Whether a PodResources resource name is one whose devices we attribute."""
    return (name in DEFAULT_RESOURCES or name in extra or bool(_MIG_RESOURCE.fullmatch(name))
            or bool(_AMD_PARTITION_RESOURCE.fullmatch(name)))
