"""GPUs a workload gets through DRA (pure): its pod template's ``resourceClaims`` (a
``resourceClaimTemplateName``: one claim per replica; a ``resourceClaimName``: one claim
every replica shares), the containers that name them, and the devices each claim's
requests ask for (``resource.k8s.io/v1``: ``exactly`` with ``allocationMode`` ExactCount
and ``count``, default 1, or All; ``firstAvailable``), read from the ResourceClaimTemplate
or ResourceClaim in the same manifest."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# The device classes of the GPU DRA drivers (NVIDIA: gpu.nvidia.com, mig.nvidia.com;
# AMD: gpu.amd.com); a class another driver names with "gpu" in it counts too.
_GPU_CLASS_SUFFIXES = (".nvidia.com", ".amd.com")
MAX_REQUESTS = 32  # DeviceRequestsMaxSize


@dataclass(frozen=True, slots=True)
class ClaimGpus:
    """What a workload's claims give each replica: ``count`` GPUs (None: not known from
    the manifest), whether it uses claims at all, and notes saying how it was read."""

    uses_claims: bool
    count: int | None
    notes: tuple[str, ...]


def _is_gpu_class(name: str) -> bool:
    return name.endswith(_GPU_CLASS_SUFFIXES) or "gpu" in name


def _dict(v: Any) -> Mapping[str, Any]:
    return v if isinstance(v, Mapping) else {}


def _items(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def claim_gpus(pod: Mapping[str, Any], containers: Sequence[Mapping[str, Any]],
               docs: Sequence[Any]) -> ClaimGpus:
    """The GPUs per replica the pod template's claims ask for, from ``docs`` (the other
    objects of the manifest). Never raises: what cannot be read is a note and a None."""
    named = {str(c.get("name")) for ct in containers
             for c in _items(_dict(ct.get("resources")).get("claims")) if isinstance(c, Mapping)}
    refs = [r for r in _items(pod.get("resourceClaims"))
            if isinstance(r, Mapping) and str(r.get("name")) in named]
    if not refs:
        return ClaimGpus(False, None, ())
    objects = {(str(d.get("kind")), str(_dict(d.get("metadata")).get("name"))): d
               for d in docs if isinstance(d, Mapping)}
    total: int | None = 0
    notes = []
    for r in refs:
        template, shared = r.get("resourceClaimTemplateName"), r.get("resourceClaimName")
        kind, name = (("ResourceClaimTemplate", template) if template
                      else ("ResourceClaim", shared))
        obj = objects.get((kind, str(name)))
        if obj is None:
            notes.append(f"GPUs: claim {r.get('name')} comes from {kind} {name}, not in this "
                         f"manifest: GPUs per replica unknown")
            total = None
            continue
        spec = _dict(obj.get("spec"))
        if kind == "ResourceClaimTemplate":
            spec = _dict(spec.get("spec"))
        count, how = _requests(_items(_dict(spec.get("devices")).get("requests")))
        if count is None or total is None:
            total = None
        else:
            total += count
        scope = ("each replica its own (ResourceClaimTemplate)" if template else
                 "ONE claim every replica shares (ResourceClaim): its GPUs are split "
                 "between the replicas")
        notes.append(f"GPUs: DRA claim {r.get('name')} from {kind} {name}: {how}; {scope}")
    return ClaimGpus(True, total, tuple(notes))


def _requests(requests: list[Any]) -> tuple[int | None, str]:
    """(GPU devices the requests ask for, or None when not a fixed number; in words)."""
    total: int | None = 0
    words = []
    for item in requests[:MAX_REQUESTS]:
        req = _dict(item)
        exactly = _dict(req.get("exactly"))
        if not exactly and req.get("firstAvailable"):
            words.append(f"{req.get('name')}: the first available of "
                         f"{len(_items(req.get('firstAvailable')))} alternatives")
            total = None
            continue
        cls = str(exactly.get("deviceClassName", ""))
        if not _is_gpu_class(cls):
            continue
        if exactly.get("allocationMode") == "All":
            words.append(f"{req.get('name')}: all {cls} devices of the node")
            total = None
            continue
        n = exactly.get("count", 1)
        n = n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1
        words.append(f"{req.get('name')}: {n} {cls}")
        total = None if total is None else total + n
    return total, ", ".join(words) or "no GPU device class requested"
