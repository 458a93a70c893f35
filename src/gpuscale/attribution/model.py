"""Values of attribution: who holds which device, and what each pod is using.

Pure data, importable without gRPC, Kubernetes or /proc access.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from gpuscale.telemetry.model import Absent, IntReading, Reading, SharingMode


class DeviceKind(enum.Enum):
    GPU = "gpu"  # a whole GPU, or one replica of a time-sliced/MPS GPU
    MIG = "mig"
    PCI = "pci"  # an AMD GPU or partition by its PCI address (the AMD device plugin's ID)
    PLATFORM = "platform"  # an AMD partition by its platform device (amdgpu_xcp_<n>)
    DRA = "dra"  # a DRA claim's (driver, pool, device), before the node's slices name it
    UNKNOWN = "unknown"  # a GPU resource's device ID in no form we read: never matched


@dataclass(frozen=True, slots=True)
class DeviceRef:
    """One device ID as the NVIDIA device plugin reports it, parsed.

    ``GPU-<uuid>``                     -> GPU, uuid
    ``GPU-<uuid>::<n>``                -> GPU, uuid, replica n (time-slicing or MPS)
    ``MIG-<uuid>``                     -> MIG, uuid
    ``MIG-GPU-<uuid>/<gi>/<ci>``       -> MIG, parent uuid, gpu/compute instance ids
    and the MIG forms with ``::<n>``; and the AMD device plugin's
    ``<domain>:<bus>:<device>.<function>``   -> PCI, the address (lower case) in ``uuid``

    A DRA claim's device (attribution/dra.py) keeps its claim (``namespace/name``) and its
    ``(driver, pool, device)``; once a ResourceSlice names it, it is one of the kinds above,
    or a MIG device by its parent GPU's uuid and ``mig_profile`` (DynamicMIG: the slice
    names no MIG uuid).
    """

    raw: str
    kind: DeviceKind
    uuid: str  # GPU-... for whole GPUs and the old MIG form's parent, MIG-... otherwise
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    replica: int | None = None
    mig_profile: str = ""  # with kind MIG and a GPU uuid: the parent's one MIG of this profile
    claim: str = ""  # DRA: the ResourceClaim, namespace/name
    dra: tuple[str, str, str] | None = None  # DRA: (driver, pool, device)


@dataclass(frozen=True, slots=True)
class Allocation:
    """One container's devices of one resource, from the kubelet's PodResources List."""

    namespace: str
    pod: str
    container: str
    resource: str  # nvidia.com/gpu, nvidia.com/gpu.shared, nvidia.com/mig-1g.10gb, ...
    devices: tuple[DeviceRef, ...]  # (DRA: resource "dra:<claim>", one per claim)


class PodPhase(enum.Enum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"


@dataclass(frozen=True, slots=True)
class OwnerRef:
    kind: str
    name: str


@dataclass(frozen=True, slots=True)
class PodInfo:
    """What the node pod cache knows of one pod (from the Kubernetes API)."""

    namespace: str
    name: str
    uid: str
    labels: tuple[tuple[str, str], ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()
    owner: OwnerRef | None = None  # the workload: Deployment, StatefulSet, Job, ... or None
    phase: PodPhase = PodPhase.UNKNOWN
    ready: bool = False
    ip: str = ""
    container_ids: tuple[tuple[str, str], ...] = ()  # (container name, runtime id w/o scheme)


@dataclass(frozen=True, slots=True)
class ProcessOwner:
    """Where a PID lives, from /proc/<pid>/cgroup."""

    pod_uid: str
    container_id: str  # runtime container id (64 hex), "" when the cgroup names none


class Split(enum.StrEnum):
    """How a device's numbers were divided between the containers that hold it."""

    EXCLUSIVE = "exclusive"  # the container has the device alone
    PROCESS = "process"  # from the container's own processes' NVML data
    SHARED = "shared"  # no per-process data: the device's whole numbers, read with sharers


@dataclass(frozen=True, slots=True)
class DeviceUsage:
    """What one pod container gets from one device.

    ``sharers`` is the number of containers holding the same physical device (1 for whole
    GPUs and MIG slices). ``split`` says how the device's numbers were divided (Split).
    """

    device: DeviceRef
    gpu_uuid: str  # the physical GPU
    gpu_index: int
    mig_uuid: str = ""
    mig_profile: str = ""
    gpu_instance_id: int | None = None
    sharing: SharingMode = SharingMode.EXCLUSIVE
    sharers: int = 1
    split: Split = Split.EXCLUSIVE
    utilization_percent: Reading = Absent.NO_DATA
    memory_used_bytes: IntReading = Absent.NO_DATA
    memory_total_bytes: IntReading = Absent.NO_DATA


@dataclass(frozen=True, slots=True)
class PodUsage:
    """One (pod, container)'s GPU usage in one tick.

    ``utilization_percent`` is the sum over its devices, in percent of one GPU (a pod with
    two busy GPUs reads 200); ``Absent`` when any device's share is unknown - never a
    partial sum. Memory likewise. ``unmatched``: its device IDs that match no device this
    node reads (not seen, or not nameable): its sums are then unknown, and so is any
    figure made from its ``devices`` alone.
    """

    namespace: str
    pod: str
    container: str
    resource: str
    devices: tuple[DeviceUsage, ...]
    utilization_percent: Reading
    memory_used_bytes: IntReading
    memory_total_bytes: IntReading
    pod_info: PodInfo | None = None  # None when the API does not know the pod (yet)
    sampled_at: float = 0.0  # wall time of the GPU sample these numbers come from
    allocated_at: float = 0.0  # wall time of the kubelet List the allocation comes from
    unmatched: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class UnattributedProcess:
    pid: int
    gpu_uuid: str
    used_memory_bytes: IntReading
    kind: str  # "no_pod", "unknown_pod", "unallocated" (bounded: a metric label)
    reason: str  # the same for a person, with the pod UID


class AttributionState(enum.Enum):
    OK = "ok"
    PARTIAL = "partial"  # some source failed: what could be attributed is, the rest is said
    UNAVAILABLE = "unavailable"  # no allocation data at all


@dataclass(frozen=True, slots=True)
class NodeAttribution:
    state: AttributionState
    reasons: tuple[str, ...] = ()
    pods: tuple[PodUsage, ...] = ()
    idle_gpus: tuple[str, ...] = ()  # GPU (or MIG) UUIDs allocated to no pod
    unattributed: tuple[UnattributedProcess, ...] = ()
    unknown_devices: tuple[str, ...] = ()  # allocated IDs that match no GPU on this node
