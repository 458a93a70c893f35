"""Attribution rules: a pure function from one tick's inputs to per-pod GPU usage.

- Whole GPU held by one container: it gets the device's utilization and memory.
- MIG slice: its holder gets the slice's memory and utilization (GPM, else unsupported).
  A partition of an AMD GPU likewise, matched by the device plugin's name for it (its PCI
  address or ``amdgpu_xcp_<n>``); a partitioned AMD GPU's own PCI address names its first
  partition, never the whole GPU (whose activity averages every partition's: smaller than
  a busy partition's).
- A GPU (or slice) held by several containers (time-slicing, MPS): each gets the SM % and
  memory of its own processes when per-process data and PID -> pod mapping exist (a
  container with no process on the device, or whose processes the driver listed without a
  sample, used 0 of it); otherwise the device's numbers are reported as shared, with the
  sharer count, and the pod's own number is ``Absent.SHARED`` - never the whole device to
  each sharer, never to the last. No process list (it failed, or the GPU is lost) is never
  read as "no processes": the pod's number is then SHARED, or LOST with the GPU.
- GPUs and slices held by nobody are idle capacity; GPU processes of no pod are flagged.
- Allocations of pods that the API says have finished (Succeeded, Failed) are left out: all
  their containers have stopped, yet a kubelet may still list them with their resources
  (before 1.34, or with KubeletPodResourcesListUseActivePods off - kubernetes/kubernetes
  #119423, #132020, fixed by #132028 - and their device-plugin devices until the device
  manager frees them, which needs all pod sources ready: not yet after a kubelet restart).
  Counted as a sharer, such a pod would split a live pod's device with a pod that uses
  nothing of it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from gpuscale.attribution.model import (
    Allocation,
    AttributionState,
    DeviceKind,
    DeviceRef,
    DeviceUsage,
    NodeAttribution,
    PodInfo,
    PodPhase,
    PodUsage,
    ProcessOwner,
    Split,
    UnattributedProcess,
)
from gpuscale.telemetry.model import (
    Absent,
    GpuSample,
    IntReading,
    MigSample,
    NodeSnapshot,
    ProcessSample,
    Reading,
    SharingMode,
)

# When several readings are missing, the sum reports the most serious reason.
_SEVERITY = (Absent.LOST, Absent.UNAVAILABLE, Absent.SHARED, Absent.UNSUPPORTED,
             Absent.NO_DATA)

Holder = tuple[str, str, str]  # namespace, pod, container
TERMINAL = (PodPhase.SUCCEEDED, PodPhase.FAILED)


@dataclass(frozen=True, slots=True)
class _Target:
    gpu: GpuSample
    mig: MigSample | None

    @property
    def key(self) -> str:
        return self.mig.uuid if self.mig else self.gpu.uuid


def attribute(snapshot: NodeSnapshot,
              allocations: Sequence[Allocation] | Absent,
              pods: Mapping[tuple[str, str], PodInfo] | Absent,
              owners: Mapping[int, ProcessOwner | None] | Absent,
              allocated_at: float = 0.0) -> NodeAttribution:
    """Attribute one tick. ``pods`` is keyed by (namespace, name); ``owners`` maps GPU
    process PIDs to their cgroup owner (None: not in a pod). Any input may be Absent (its
    source failed); the result then says so in ``state`` and ``reasons``. Allocations of
    pods whose phase in ``pods`` is Succeeded or Failed hold nothing: they are left out."""
    if isinstance(allocations, Absent):
        return NodeAttribution(AttributionState.UNAVAILABLE,
                               (f"kubelet pod resources {allocations.value}",),
                               idle_gpus=())
    reasons: list[str] = []
    if isinstance(pods, Absent):
        reasons.append(f"pod metadata {pods.value}")
    resolve = _resolver(snapshot)
    holders: dict[str, set[Holder]] = defaultdict(set)
    resolved: list[tuple[Allocation, list[tuple[DeviceRef, _Target]], list[str]]] = []
    unknown: list[str] = []
    for a in allocations:
        done = None if isinstance(pods, Absent) else pods.get((a.namespace, a.pod))
        if done is not None and done.phase in TERMINAL:
            continue
        targets = []
        missing: list[str] = []
        for ref in a.devices:
            t = resolve(ref) if ref.kind is not DeviceKind.UNKNOWN else None
            if t is None:
                missing.append(ref.raw)
                continue
            holders[t.key].add((a.namespace, a.pod, a.container))
            targets.append((ref, t))
        unknown.extend(missing)
        resolved.append((a, targets, missing))
    if unknown:
        reasons.append(f"{len(unknown)} allocated device(s) not seen on this node")

    uid_of = ({} if isinstance(pods, Absent) else
              {(p.namespace, p.name): p.uid for p in pods.values()})
    usages: list[PodUsage] = []
    missing_pods: set[str] = set()
    for a, targets, missing in resolved:
        complete = not missing
        info = None if isinstance(pods, Absent) else pods.get((a.namespace, a.pod))
        if info is None and not isinstance(pods, Absent):
            missing_pods.add(f"{a.namespace}/{a.pod}")
        seen: set[str] = set()
        devices = []
        for ref, t in targets:
            if t.key in seen:  # two replicas of one GPU in one container count once
                continue
            seen.add(t.key)
            devices.append(_device_usage(ref, t, len(holders[t.key]), info, a.container,
                                         owners))
        # A device of the pod's not seen (or not readable): its sums would be those of the
        # others alone - smaller than what the pod uses. Unknown instead.
        util = _sum([d.utilization_percent for d in devices])
        used = _isum([d.memory_used_bytes for d in devices])
        total = _isum([d.memory_total_bytes for d in devices])
        usages.append(PodUsage(
            a.namespace, a.pod, a.container, a.resource, tuple(devices),
            util if complete or isinstance(util, Absent) else Absent.NO_DATA,
            used if complete or isinstance(used, Absent) else Absent.NO_DATA,
            total if complete or isinstance(total, Absent) else Absent.NO_DATA,
            pod_info=info, sampled_at=snapshot.taken_at, allocated_at=allocated_at,
            unmatched=tuple(missing)))
    if missing_pods:
        reasons.append(f"{len(missing_pods)} pod(s) not in the API cache yet: "
                       f"{', '.join(sorted(missing_pods)[:5])}")
    if isinstance(owners, Absent) and any(len(h) > 1 for h in holders.values()):
        reasons.append(f"process owners {owners.value}: shared GPUs cannot be split by pod")

    idle = [g.uuid for g in snapshot.gpus if not g.mig_enabled and g.uuid not in holders]
    idle += [m.uuid for g in snapshot.gpus for m in g.migs if m.uuid not in holders]
    allocated_uids = {uid_of.get((ns, pod)) for hs in holders.values() for ns, pod, _ in hs}
    orphans = _unattributed(snapshot, owners, pods, allocated_uids)
    state = AttributionState.PARTIAL if reasons else AttributionState.OK
    return NodeAttribution(state, tuple(reasons), tuple(usages), tuple(idle), orphans,
                           tuple(unknown))


def _resolver(snapshot: NodeSnapshot) -> Callable[[DeviceRef], _Target | None]:
    """The device (GPU, MIG instance or AMD partition) of ``snapshot`` a device reference of
    the kubelet names, or None: by UUID; by PCI address or partition name (AMD), only where
    exactly one device has it; by GPU and instance ids (MIG)."""
    gpus = {g.uuid: g for g in snapshot.gpus}
    pcis = [g.pci_bus_id.lower() for g in snapshot.gpus if g.pci_bus_id]
    by_pci = {g.pci_bus_id.lower(): g for g in snapshot.gpus  # an address two devices
              if g.pci_bus_id and pcis.count(g.pci_bus_id.lower()) == 1  # share: neither
              and not g.mig_enabled}  # a partitioned GPU: by its partitions' names only
    names = [m.device_id.lower() for g in snapshot.gpus for m in g.migs if m.device_id]
    by_name = {m.device_id.lower(): (g, m) for g in snapshot.gpus for m in g.migs
               if m.device_id and names.count(m.device_id.lower()) == 1}
    migs = {m.uuid: (g, m) for g in snapshot.gpus for m in g.migs}
    mig_ids = {(g.uuid, m.gpu_instance_id, m.compute_instance_id): (g, m)
               for g in snapshot.gpus for m in g.migs}

    def resolve(ref: DeviceRef) -> _Target | None:
        if ref.kind is DeviceKind.GPU:
            g = gpus.get(ref.uuid)
            return _Target(g, None) if g else None
        if ref.kind in (DeviceKind.PCI, DeviceKind.PLATFORM):  # AMD: a GPU or partition
            part = by_name.get(ref.uuid)
            if part:
                return _Target(*part)
            g = by_pci.get(ref.uuid) if ref.kind is DeviceKind.PCI else None
            return _Target(g, None) if g else None
        if ref.kind is not DeviceKind.MIG:
            return None  # DRA (not named by a slice) or unknown: never matched
        if ref.mig_profile:  # DRA DynamicMIG: the parent's one MIG device of the profile
            same = [m for m in (gpus[ref.uuid].migs if ref.uuid in gpus else ())
                    if m.profile == ref.mig_profile]
            return _Target(gpus[ref.uuid], same[0]) if len(same) == 1 else None
        hit = (migs.get(ref.uuid) if ref.gpu_instance_id is None
               else mig_ids.get((ref.uuid, ref.gpu_instance_id, ref.compute_instance_id or 0)))
        return _Target(*hit) if hit else None

    return resolve


def _device_usage(ref: DeviceRef, t: _Target, sharers: int, info: PodInfo | None,
                  container: str,
                  owners: Mapping[int, ProcessOwner | None] | Absent) -> DeviceUsage:
    g, m = t.gpu, t.mig
    sharing = SharingMode.MIG if m else g.sharing
    if sharers > 1 and sharing is SharingMode.EXCLUSIVE:
        sharing = SharingMode.TIME_SLICED  # several holders: the plugin replicated it
    usage = DeviceUsage(
        device=ref, gpu_uuid=g.uuid, gpu_index=g.index, mig_uuid=m.uuid if m else "",
        mig_profile=m.profile if m else "", gpu_instance_id=m.gpu_instance_id if m else None,
        sharing=sharing, sharers=sharers,
        utilization_percent=m.utilization_percent if m else g.utilization_percent,
        memory_used_bytes=m.memory_used_bytes if m else g.memory_used_bytes,
        memory_total_bytes=m.memory_total_bytes if m else g.memory_total_bytes)
    if sharers == 1:
        return usage
    unknown = m.processes_unknown if m else g.processes_unknown
    own = _own_processes(m.processes if m else g.processes, info, container, owners)
    if own is None or unknown is not None:  # no way to tell whose processes are whose
        why = Absent.LOST if unknown is Absent.LOST else Absent.SHARED
        return replace(usage, split=Split.SHARED, utilization_percent=why,
                       memory_used_bytes=why)
    return replace(usage, split=Split.PROCESS,
                   utilization_percent=_sum([p.sm_util_percent for p in own]),
                   memory_used_bytes=_isum([p.used_memory_bytes for p in own]))


def _own_processes(procs: Sequence[ProcessSample], info: PodInfo | None, container: str,
                   owners: Mapping[int, ProcessOwner | None] | Absent,
                   ) -> list[ProcessSample] | None:
    """This container's processes among a device's (full) process list, or None when the
    owners cannot be known."""
    if isinstance(owners, Absent) or info is None:
        return None
    cid = dict(info.container_ids).get(container, "")
    own = []
    for p in procs:
        o = owners.get(p.pid)
        if o is not None and o.pod_uid == info.uid and (not cid or not o.container_id
                                                        or o.container_id == cid):
            own.append(p)
    return own


def _unattributed(snapshot: NodeSnapshot, owners: Mapping[int, ProcessOwner | None] | Absent,
                  pods: Mapping[tuple[str, str], PodInfo] | Absent,
                  allocated_uids: set[str | None]) -> tuple[UnattributedProcess, ...]:
    if isinstance(owners, Absent):
        return ()
    known = set() if isinstance(pods, Absent) else {p.uid for p in pods.values()}
    out = []
    for g in snapshot.gpus:
        for p in g.processes:
            o = owners.get(p.pid)
            if o is None:
                kind, reason = "no_pod", "not in a pod"
            elif not isinstance(pods, Absent) and o.pod_uid not in known:
                kind, reason = "unknown_pod", f"pod {o.pod_uid} unknown to the API"
            elif not isinstance(pods, Absent) and o.pod_uid not in allocated_uids:
                kind, reason = "unallocated", f"pod {o.pod_uid} uses a GPU it was not allocated"
            else:
                continue
            out.append(UnattributedProcess(p.pid, g.uuid, p.used_memory_bytes, kind, reason))
    return tuple(out)


def _worst(values: Sequence[object]) -> Absent | None:
    absent = [v for v in values if isinstance(v, Absent)]
    if not absent:
        return None
    return min(absent, key=_SEVERITY.index)


def _sum(values: Sequence[Reading]) -> Reading:
    worst = _worst(values)
    return worst if worst is not None else float(sum(v for v in values
                                                     if not isinstance(v, Absent)))


def _isum(values: Sequence[IntReading]) -> IntReading:
    worst = _worst(values)
    return worst if worst is not None else sum(v for v in values if not isinstance(v, Absent))
