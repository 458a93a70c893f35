"""DRA devices named: ResourceSlices read into (driver, pool, device) -> GPU, pure.

The kubelet names a claim's device by ``(driver, pool, device)`` (``gpu.nvidia.com``,
``node-1``, ``gpu-0``); which GPU that is lives in the node's ResourceSlices
(``resource.k8s.io/v1``), as attributes of the device:

- NVIDIA (``gpu.nvidia.com``): ``type: gpu`` with ``uuid`` (``GPU-...``); ``type: mig``
  with its own ``uuid`` (``MIG-...``) when the MIG device exists, else (DynamicMIG)
  ``parentUUID`` and ``profile`` only.
- AMD (``gpu.amd.com``): ``type: amdgpu`` with ``resource.kubernetes.io/pciBusID``; a
  partition carries its parent's address, which names no one partition: not attributable.
- Any other driver: a device whose attributes carry a GPU or MIG UUID is that device; one
  that carries none is not a GPU gpuscale can read, and a pod holding it is unknown.

Only a pool's slices at its highest generation count, and a pool with fewer slices seen
than ``resourceSliceCount`` says is incomplete (the API's contract for consumers). Every
device that cannot be named makes its holder's numbers unknown, with a reason naming the
claim (``resolve``): never a smaller sum of the devices that could be.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpuscale.attribution.model import Allocation, DeviceKind, DeviceRef
from gpuscale.common.errors import PeerError

NVIDIA = "gpu.nvidia.com"
AMD = "gpu.amd.com"
GPU_DRIVERS = (NVIDIA, AMD)
MAX_DRIVER = 63  # DriverNameMaxLength
MAX_POOL = 253  # PoolNameMaxLength
MAX_DEVICE_NAME = 63  # a DNS label
MAX_DEVICES = 128  # ResourceSliceMaxDevices
MAX_ATTRIBUTES = 32  # ResourceSliceMaxAttributesAndCapacitiesPerDevice
MAX_VALUE = 64  # DeviceAttributeMaxValueLength
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"

_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_GPU_UUID = re.compile(rf"GPU-{_UUID}")
_MIG_UUID = re.compile(rf"MIG-{_UUID}")
_PCI = re.compile(r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]")
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


class SliceError(PeerError, ValueError):
    """A ResourceSlice in a shape the API does not allow (or beyond its bounds): the API
    server answered something unusable."""


@dataclass(frozen=True, slots=True)
class SliceDevice:
    """One device of a slice: ``ref`` the physical device it is (kind, uuid, MIG profile),
    or None with ``why`` (in words) when its attributes name none gpuscale reads."""

    name: str
    ref: DeviceRef | None
    why: str = ""


@dataclass(frozen=True, slots=True)
class PoolSlice:
    """One ResourceSlice as read (``error``: why it could not be, then no devices)."""

    name: str
    driver: str
    pool: str
    generation: int = 0
    slice_count: int = 1
    devices: tuple[SliceDevice, ...] = ()
    error: str = ""


def parse_slice(raw: Mapping[str, Any]) -> PoolSlice:
    """A PoolSlice from a ResourceSlice's JSON; never raises: a slice the API's contract
    does not allow is kept with ``error`` (so its pool reads as unreadable, not empty)."""
    meta = raw.get("metadata")
    name = str(meta.get("name", ""))[:253] if isinstance(meta, Mapping) else ""
    spec = raw.get("spec")
    driver = pool = ""
    try:
        if not isinstance(spec, Mapping):
            raise SliceError("no spec")
        driver = _text(spec.get("driver"), "spec.driver", MAX_DRIVER)
        if not _DOMAIN.fullmatch(driver):
            raise SliceError(f"spec.driver {driver!r} is not a DNS subdomain")
        p = spec.get("pool")
        if not isinstance(p, Mapping):
            raise SliceError("spec.pool is not an object")
        pool = _text(p.get("name"), "spec.pool.name", MAX_POOL)
        generation = _int(p.get("generation"), "spec.pool.generation")
        count = _int(p.get("resourceSliceCount"), "spec.pool.resourceSliceCount")
        if count < 1:
            raise SliceError("spec.pool.resourceSliceCount is below 1")
        devices = spec.get("devices")
        devices = [] if devices is None else devices
        if not isinstance(devices, list):
            raise SliceError("spec.devices is not a list")
        if len(devices) > MAX_DEVICES:
            raise SliceError(f"{len(devices)} devices (the API allows {MAX_DEVICES})")
        parsed = tuple(_device(driver, d) for d in devices)
    except SliceError as exc:
        return PoolSlice(name, driver, pool, error=str(exc))
    return PoolSlice(name, driver, pool, generation, count, parsed)


def _text(v: object, what: str, limit: int) -> str:
    if not isinstance(v, str) or not v:
        raise SliceError(f"{what} is not a non-empty string")
    if len(v) > limit:
        raise SliceError(f"{what} is longer than {limit} characters")
    return v


def _int(v: object, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**63:
        raise SliceError(f"{what} is not a non-negative integer")
    return v


def _device(driver: str, raw: object) -> SliceDevice:
    if not isinstance(raw, Mapping):
        raise SliceError("a device is not an object")
    name = _text(raw.get("name"), "a device's name", MAX_DEVICE_NAME)
    if not _NAME.fullmatch(name):
        raise SliceError(f"device name {name[:64]!r} is not a DNS label")
    attrs = raw.get("attributes")
    attrs = {} if attrs is None else attrs
    if not isinstance(attrs, Mapping):
        raise SliceError(f"device {name}: attributes is not an object")
    if len(attrs) > MAX_ATTRIBUTES:
        raise SliceError(f"device {name}: {len(attrs)} attributes (the API allows "
                         f"{MAX_ATTRIBUTES})")
    values = {}
    for key, value in attrs.items():
        if not isinstance(value, Mapping) or len(value) != 1:
            raise SliceError(f"device {name}: attribute {str(key)[:64]!r} is not one value")
        (kind, v), = value.items()
        if kind in ("string", "version"):
            if not isinstance(v, str) or len(v) > MAX_VALUE:
                raise SliceError(f"device {name}: attribute {str(key)[:64]!r} is not a "
                                 f"string of at most {MAX_VALUE} characters")
            # an unqualified name is in the driver's own domain
            values[str(key) if "/" in str(key) else f"{driver}/{key}"] = v
    return _identify(driver, name, values)


def _identify(driver: str, name: str, attrs: Mapping[str, str]) -> SliceDevice:
    def own(key: str) -> str:
        return attrs.get(f"{driver}/{key}", "")

    kind = own("type")
    uuid, parent, profile = own("uuid"), own("parentUUID"), own("profile")
    raw = f"{driver}/{name}"
    if _GPU_UUID.fullmatch(uuid) and kind in ("", "gpu"):
        return SliceDevice(name, DeviceRef(raw, DeviceKind.GPU, uuid))
    if _MIG_UUID.fullmatch(uuid):
        return SliceDevice(name, DeviceRef(raw, DeviceKind.MIG, uuid))
    if kind == "mig" and _GPU_UUID.fullmatch(parent) and profile:
        return SliceDevice(name, DeviceRef(raw, DeviceKind.MIG, parent, mig_profile=profile))
    if driver == AMD and kind == "amdgpu-partition":
        return SliceDevice(name, None, "an AMD partition: its slice names only its parent "
                                       "GPU's PCI address, shared by every partition")
    pci = attrs.get(PCI_BUS_ID, "")
    if driver == AMD and kind == "amdgpu" and _PCI.fullmatch(pci):
        return SliceDevice(name, DeviceRef(raw, DeviceKind.PCI, pci.lower()))
    if kind == "vfio":
        return SliceDevice(name, None, "a GPU passed through to a virtual machine (vfio): "
                                       "no driver on this node reads it")
    return SliceDevice(name, None, f"its slice names no GPU (type {kind[:20]!r}, "
                                   f"no GPU or MIG uuid)")


@dataclass(frozen=True, slots=True)
class DraInventory:
    """The devices of this node's ResourceSlices: (driver, pool, device) -> SliceDevice,
    from each pool's highest generation; pools that cannot be read in full, with why."""

    devices: Mapping[tuple[str, str, str], SliceDevice] = field(default_factory=dict)
    unreadable: Mapping[tuple[str, str], str] = field(default_factory=dict)
    problems: tuple[str, ...] = ()  # slices that name no driver or pool at all

    @classmethod
    def build(cls, slices: Iterable[PoolSlice]) -> DraInventory:
        pools: dict[tuple[str, str], list[PoolSlice]] = {}
        problems = []
        for s in slices:
            if not s.driver or not s.pool:
                problems.append(f"ResourceSlice {s.name[:80]}: {s.error}")
                continue
            pools.setdefault((s.driver, s.pool), []).append(s)
        devices: dict[tuple[str, str, str], SliceDevice] = {}
        unreadable: dict[tuple[str, str], str] = {}
        for key, members in pools.items():
            bad = [s for s in members if s.error]
            if bad:
                unreadable[key] = f"ResourceSlice {bad[0].name[:80]}: {bad[0].error}"
                continue
            top = max(s.generation for s in members)
            current = [s for s in members if s.generation == top]
            if len(current) < current[0].slice_count:
                unreadable[key] = (f"{len(current)} of its {current[0].slice_count} "
                                   f"ResourceSlices seen (generation {top})")
            for s in current:
                for d in s.devices:
                    devices[(s.driver, s.pool, d.name)] = d
        return cls(devices, unreadable, tuple(problems))

    def lookup(self, driver: str, pool: str, device: str) -> SliceDevice | str:
        """The slice's device, or why there is none (in words)."""
        if (driver, pool) in self.unreadable:
            return f"pool {pool} of {driver} unreadable: {self.unreadable[(driver, pool)]}"
        found = self.devices.get((driver, pool, device))
        if found is None:
            return "no ResourceSlice of this node lists it (yet)"
        return found


def dra_ref(namespace: str, claim: str, driver: str, pool: str, device: str) -> DeviceRef:
    """A device the kubelet lists for a claim, not named yet (kind DRA): ``raw`` names the
    claim first (a person reads the reason by it)."""
    text = f"claim {namespace}/{claim}: {driver}/{pool}/{device}"
    return DeviceRef(text[:512], DeviceKind.DRA, "", dra=(driver, pool, device),
                     claim=f"{namespace}/{claim}")


def resolve(allocations: Sequence[Allocation], inventory: DraInventory | None,
            missing: str = "no ResourceSlice watch") -> tuple[list[Allocation], list[str]]:
    """The allocations with every DRA device named from ``inventory``: a GPU, a MIG
    device or an AMD GPU; UNKNOWN (never matched: its holder's numbers are unknown) when
    no slice names it, and a note naming the claim and why. ``inventory`` None: no slice
    is known (``missing`` says why). A device of a driver whose slice says it is no GPU
    (``type`` not a GPU's, no uuid) is unknown too: gpuscale cannot tell it is not one."""
    out: list[Allocation] = []
    notes: list[str] = []
    for a in allocations:
        if not any(r.kind is DeviceKind.DRA for r in a.devices):
            out.append(a)
            continue
        refs = []
        for r in a.devices:
            if r.kind is not DeviceKind.DRA or r.dra is None:
                refs.append(r)
                continue
            found = inventory.lookup(*r.dra) if inventory is not None else missing
            if isinstance(found, SliceDevice) and found.ref is not None:
                refs.append(replace(found.ref, raw=r.raw, claim=r.claim, dra=r.dra))
                continue
            why = found if isinstance(found, str) else found.why
            refs.append(replace(r, kind=DeviceKind.UNKNOWN, raw=f"{r.raw} ({why})"[:512]))
            notes.append(f"{a.namespace}/{a.pod}/{a.container}: {r.raw[:160]}: {why}")
        out.append(replace(a, devices=tuple(refs)))
    return out, notes
