"""Attribution rules: table cases and properties, no I/O."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscale.attribution.devices import DeviceIdError, is_gpu_resource, parse_device_id
from gpuscale.attribution.model import (
    Allocation,
    AttributionState,
    DeviceKind,
    DeviceRef,
    PodInfo,
    PodPhase,
    ProcessOwner,
)
from gpuscale.attribution.rules import attribute
from gpuscale.telemetry.model import (
    Absent,
    GpuSample,
    GpuState,
    MigSample,
    NodeSnapshot,
    ProcessSample,
    SharingMode,
)

GIB = 2**30


def uuid(i: int, kind: str = "GPU") -> str:
    return f"{kind}-00000000-0000-0000-0000-{i:012d}"


def gpu(i: int, util: float | Absent = 50.0, **kw: object) -> GpuSample:
    fields: dict[str, object] = {"index": i, "uuid": uuid(i), "name": "G", "pci_bus_id": "",
                                 "minor_number": i, "utilization_percent": util,
                                 "memory_used_bytes": 10 * GIB, "memory_total_bytes": 80 * GIB}
    fields.update(kw)
    return GpuSample(**fields)  # type: ignore[arg-type]


def snap(*gpus: GpuSample) -> NodeSnapshot:
    return NodeSnapshot(node="n", backend="t", taken_at=100.0, monotonic=1.0, gpus=gpus)


def alloc(pod: str, *ids: str, container: str = "c", ns: str = "ns",
          resource: str = "nvidia.com/gpu") -> Allocation:
    return Allocation(ns, pod, container, resource, tuple(parse_device_id(i) for i in ids))


def info(pod: str, uid: str, ns: str = "ns", containers: tuple[tuple[str, str], ...] = ()
         ) -> PodInfo:
    return PodInfo(ns, pod, uid, container_ids=containers)


def pods(*infos: PodInfo) -> dict[tuple[str, str], PodInfo]:
    return {(p.namespace, p.name): p for p in infos}


def test_whole_gpus_go_to_their_pod() -> None:
    result = attribute(snap(gpu(0, 30.0), gpu(1, 70.0), gpu(2, 5.0)),
                       [alloc("a", uuid(0), uuid(1))], pods(info("a", "u-a")), {})
    assert result.state is AttributionState.OK
    (a,) = result.pods
    assert a.utilization_percent == 100.0  # two GPUs: 30 + 70 GPU-percent
    assert a.memory_used_bytes == 20 * GIB
    assert a.memory_total_bytes == 160 * GIB
    assert [d.split for d in a.devices] == ["exclusive", "exclusive"]
    assert result.idle_gpus == (uuid(2),)
    assert a.sampled_at == 100.0


def test_seven_mig_slices_each_to_its_pod() -> None:
    migs = tuple(MigSample(uuid(10 + i, "MIG"), uuid(0), i, i + 7, 0, "1g.10gb",
                           GIB * (i + 1), 10 * GIB, 10.0 * i if i < 6 else Absent.UNSUPPORTED)
                 for i in range(7))
    g = gpu(0, Absent.UNSUPPORTED, mig_enabled=True, sharing=SharingMode.MIG, migs=migs)
    allocs = [alloc(f"p{i}", uuid(10 + i, "MIG"), resource="nvidia.com/mig-1g.10gb")
              for i in range(6)]
    allocs.append(alloc("old-form", f"MIG-{uuid(0)}/13/0", resource="nvidia.com/mig-1g.10gb"))
    result = attribute(snap(g), allocs, pods(*(info(f"p{i}", f"u{i}") for i in range(6)),
                                             info("old-form", "u6")), {})
    got = {p.pod: p for p in result.pods}
    assert got["p3"].utilization_percent == 30.0
    assert got["p3"].memory_used_bytes == 4 * GIB
    assert got["p3"].devices[0].mig_profile == "1g.10gb"
    assert got["p3"].devices[0].sharing is SharingMode.MIG
    # No GPM on this slice: unsupported is carried, not turned into 0.
    assert got["old-form"].utilization_percent is Absent.UNSUPPORTED
    assert got["old-form"].memory_used_bytes == 7 * GIB
    assert result.idle_gpus == ()


def time_sliced(procs: dict[int, tuple[float | Absent, int]]) -> GpuSample:
    return gpu(0, 80.0, sharing=SharingMode.TIME_SLICED,
               processes=tuple(ProcessSample(pid, mem, sm) for pid, (sm, mem) in procs.items()))


def test_four_pods_time_slicing_one_gpu_get_their_own_processes() -> None:
    g = time_sliced({1: (10.0, GIB), 2: (20.0, 2 * GIB), 3: (5.0, 3 * GIB), 4: (40.0, GIB),
                     5: (3.0, GIB)})
    allocs = [alloc(f"p{i}", f"{uuid(0)}::{i}", resource="nvidia.com/gpu.shared")
              for i in range(1, 5)]
    infos = pods(*(info(f"p{i}", f"u{i}", containers=(("c", f"cid{i}"),)) for i in range(1, 5)))
    owners = {i: ProcessOwner(f"u{i}", f"cid{i}") for i in range(1, 5)}
    owners[5] = ProcessOwner("u4", "cid4")  # p4 has two processes
    result = attribute(snap(g), allocs, infos, owners)
    got = {p.pod: p for p in result.pods}
    assert [got[f"p{i}"].utilization_percent for i in range(1, 5)] == [10.0, 20.0, 5.0, 43.0]
    assert got["p4"].memory_used_bytes == 2 * GIB
    assert {d.split for p in result.pods for d in p.devices} == {"process"}
    assert {d.sharers for p in result.pods for d in p.devices} == {4}
    assert {d.sharing for p in result.pods for d in p.devices} == {SharingMode.TIME_SLICED}
    assert result.state is AttributionState.OK
    assert result.unattributed == ()


def test_shared_gpu_without_process_owners_is_reported_shared_never_whole() -> None:
    g = time_sliced({1: (10.0, GIB), 2: (20.0, GIB)})
    allocs = [alloc("p1", f"{uuid(0)}::0"), alloc("p2", f"{uuid(0)}::1")]
    result = attribute(snap(g), allocs, pods(info("p1", "u1"), info("p2", "u2")),
                       Absent.UNAVAILABLE)
    assert result.state is AttributionState.PARTIAL
    assert "shared GPUs cannot be split by pod" in result.reasons[0]
    for p in result.pods:
        assert p.utilization_percent is Absent.SHARED
        assert p.memory_used_bytes is Absent.SHARED
        assert p.devices[0].sharers == 2
        assert p.devices[0].split == "shared"


def test_shared_gpu_process_with_no_data_makes_the_pod_no_data() -> None:
    g = time_sliced({1: (Absent.NO_DATA, GIB), 2: (20.0, GIB)})
    allocs = [alloc("p1", f"{uuid(0)}::0"), alloc("p2", f"{uuid(0)}::1")]
    owners = {1: ProcessOwner("u1", ""), 2: ProcessOwner("u2", "")}
    result = attribute(snap(g), allocs, pods(info("p1", "u1"), info("p2", "u2")), owners)
    got = {p.pod: p for p in result.pods}
    assert got["p1"].utilization_percent is Absent.NO_DATA
    assert got["p2"].utilization_percent == 20.0


def test_shared_gpu_idle_pod_reads_zero_from_its_unsampled_process() -> None:
    # The NVML backend gives a listed process without a sample 0.0: its pod used nothing,
    # and a pod with no process on the device likewise.
    g = time_sliced({1: (0.0, GIB), 2: (20.0, GIB)})
    allocs = [alloc(f"p{i}", f"{uuid(0)}::{i}") for i in (1, 2, 3)]
    owners = {1: ProcessOwner("u1", ""), 2: ProcessOwner("u2", "")}
    result = attribute(snap(g), allocs, pods(*(info(f"p{i}", f"u{i}") for i in (1, 2, 3))),
                       owners)
    got = {p.pod: p for p in result.pods}
    assert [got[f"p{i}"].utilization_percent for i in (1, 2, 3)] == [0.0, 20.0, 0.0]
    assert result.state is AttributionState.OK


def test_shared_gpu_without_a_process_list_is_never_read_as_idle() -> None:
    # The listing failed (or the GPU is lost): an empty list there is no evidence of idleness.
    failed = gpu(0, 80.0, sharing=SharingMode.TIME_SLICED,
                 processes_unknown=Absent.UNAVAILABLE)
    lost = gpu(1, Absent.LOST, state=GpuState.LOST, sharing=SharingMode.TIME_SLICED,
               memory_used_bytes=Absent.LOST, processes_unknown=Absent.LOST)
    allocs = [alloc(f"p{i}", f"{uuid(i // 2)}::{i % 2}") for i in range(4)]
    owners = {1: ProcessOwner("u0", "")}
    result = attribute(snap(failed, lost), allocs,
                       pods(*(info(f"p{i}", f"u{i}") for i in range(4))), owners)
    got = {p.pod: p for p in result.pods}
    for i, why in [(0, Absent.SHARED), (1, Absent.SHARED), (2, Absent.LOST),
                   (3, Absent.LOST)]:
        assert got[f"p{i}"].utilization_percent is why
        assert got[f"p{i}"].memory_used_bytes is why
        assert got[f"p{i}"].devices[0].split == "shared"


def test_pod_on_a_slice_of_a_lost_mig_gpu_reads_lost() -> None:
    mig = MigSample(uuid(10, "MIG"), uuid(0), 0, 1, 0, "3g.40gb", Absent.LOST, Absent.LOST,
                    Absent.LOST, (), Absent.LOST)
    g = gpu(0, Absent.LOST, state=GpuState.LOST, mig_enabled=True, sharing=SharingMode.MIG,
            migs=(mig,), processes_unknown=Absent.LOST)
    allocs = [alloc("a", uuid(10, "MIG")), alloc("b", f"{uuid(10, 'MIG')}::0"),
              alloc("c", f"{uuid(10, 'MIG')}::1")]
    result = attribute(snap(g), allocs, pods(info("a", "ua"), info("b", "ub"),
                                             info("c", "uc")), {})
    assert [p.utilization_percent for p in result.pods] == [Absent.LOST] * 3


def test_processes_of_no_pod_unknown_pods_and_unallocated_use_are_flagged() -> None:
    g0 = gpu(0, 90.0, processes=(ProcessSample(1, GIB), ProcessSample(2, GIB)))
    g1 = gpu(1, 10.0, processes=(ProcessSample(3, GIB), ProcessSample(4, GIB)))
    owners = {1: ProcessOwner("u-a", "x"), 2: None, 3: ProcessOwner("u-ghost", ""),
              4: ProcessOwner("u-b", "")}
    result = attribute(snap(g0, g1), [alloc("a", uuid(0))],
                       pods(info("a", "u-a"), info("b", "u-b")), owners)
    flagged = {u.pid: u.reason for u in result.unattributed}
    assert flagged == {2: "not in a pod", 3: "pod u-ghost unknown to the API",
                       4: "pod u-b uses a GPU it was not allocated"}
    assert result.idle_gpus == (uuid(1),)


def test_pod_unknown_to_the_api_keeps_its_numbers_and_says_so() -> None:
    result = attribute(snap(gpu(0, 42.0)), [alloc("new", uuid(0))], pods(), {})
    (p,) = result.pods
    assert p.pod_info is None
    assert p.utilization_percent == 42.0
    assert result.state is AttributionState.PARTIAL
    assert "not in the API cache yet: ns/new" in result.reasons[0]


def test_sources_missing() -> None:
    down = attribute(snap(gpu(0)), Absent.UNAVAILABLE, pods(), {})
    assert down.state is AttributionState.UNAVAILABLE
    assert down.reasons == ("kubelet pod resources unavailable",)
    assert down.idle_gpus == ()  # not knowing allocations is not "idle"
    no_api = attribute(snap(gpu(0, 5.0)), [alloc("a", uuid(0))], Absent.UNAVAILABLE, {})
    assert no_api.state is AttributionState.PARTIAL
    assert no_api.pods[0].utilization_percent == 5.0


def test_devices_not_on_this_node_and_lost_gpus() -> None:
    lost = gpu(1, Absent.LOST, state=GpuState.LOST, memory_used_bytes=Absent.LOST)
    result = attribute(snap(gpu(0), lost), [alloc("a", uuid(0), uuid(1), uuid(9))],
                       pods(info("a", "u")), {})
    (p,) = result.pods
    assert p.utilization_percent is Absent.LOST  # never the sum of the GPUs that answered
    assert result.unknown_devices == (uuid(9),)
    assert "1 allocated device(s) not seen on this node" in result.reasons


def test_two_replicas_of_one_gpu_in_one_container_count_once() -> None:
    g = time_sliced({1: (30.0, GIB)})
    result = attribute(snap(g), [alloc("a", f"{uuid(0)}::0", f"{uuid(0)}::1")],
                       pods(info("a", "u")), {1: ProcessOwner("u", "")})
    (p,) = result.pods
    assert len(p.devices) == 1
    assert p.devices[0].sharers == 1
    assert p.utilization_percent == 80.0  # sole holder: the whole device


@pytest.mark.parametrize("phase", [PodPhase.SUCCEEDED, PodPhase.FAILED])
def test_finished_pods_the_kubelet_still_lists_hold_nothing(phase: PodPhase) -> None:
    """A Job pod that finished is still listed with its replica of the GPU; the pod serving
    there now gets the device alone, not a split with a pod that runs nothing."""
    g = time_sliced({1: (30.0, GIB)})  # only the live pod's process is on the GPU
    allocs = [alloc("done", f"{uuid(0)}::0"), alloc("live", f"{uuid(0)}::1"),
              alloc("done-too", uuid(1))]
    infos = pods(replace(info("done", "u-d"), phase=phase),
                 replace(info("live", "u-l"), phase=PodPhase.RUNNING),
                 replace(info("done-too", "u-t"), phase=phase))
    result = attribute(snap(g, gpu(1, 0.0)), allocs, infos, {1: ProcessOwner("u-l", "")})
    (live,) = result.pods
    assert live.pod == "live"
    assert live.utilization_percent == 80.0  # the device's reading, sole holder
    assert (live.devices[0].sharers, live.devices[0].split) == (1, "exclusive")
    assert result.idle_gpus == (uuid(1),)  # held only by a finished pod: free
    assert result.state is AttributionState.OK


def test_phases_that_may_still_run_keep_their_allocations() -> None:
    g = time_sliced({1: (30.0, GIB), 2: (10.0, GIB)})
    allocs = [alloc("starting", f"{uuid(0)}::0"), alloc("unknown", f"{uuid(0)}::1")]
    infos = pods(replace(info("starting", "u-s"), phase=PodPhase.PENDING),
                 replace(info("unknown", "u-u"), phase=PodPhase.UNKNOWN))
    owners = {1: ProcessOwner("u-s", ""), 2: ProcessOwner("u-u", "")}
    result = attribute(snap(g), allocs, infos, owners)
    assert {p.pod: p.utilization_percent for p in result.pods} == {"starting": 30.0,
                                                                   "unknown": 10.0}
    # Without the API no phase is known: every listed allocation still counts.
    blind = attribute(snap(g), allocs, Absent.UNAVAILABLE, owners)
    assert {d.sharers for p in blind.pods for d in p.devices} == {2}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.floats(0, 100)), max_size=12),
       st.lists(st.integers(0, 5), min_size=1, max_size=6), st.booleans())
def test_shared_split_never_exceeds_what_the_processes_used(
        procs: list[tuple[int, float]], holders: list[int], owners_known: bool) -> None:
    """Whatever the sharing, pods on one GPU never get more than its processes used, and
    no sharer is handed the whole device."""
    g = gpu(0, 100.0, processes=tuple(ProcessSample(1000 + i, GIB, sm)
                                      for i, (_, sm) in enumerate(procs)))
    holder_set = sorted(set(holders))
    allocs = [alloc(f"p{h}", f"{uuid(0)}::{h}") for h in holder_set]
    infos = pods(*(info(f"p{h}", f"u{h}") for h in range(6)))
    owners = ({1000 + i: ProcessOwner(f"u{owner}", "") for i, (owner, _) in enumerate(procs)}
              if owners_known else Absent.UNAVAILABLE)
    result = attribute(snap(g), allocs, infos, owners)
    utils = [p.utilization_percent for p in result.pods]
    if len(holder_set) == 1:
        assert utils == [100.0]
    elif owners_known:
        assert all(isinstance(u, float) for u in utils)
        assert sum(u for u in utils if isinstance(u, float)) <= sum(sm for _, sm in procs) + 1e-6
    else:
        assert all(u is Absent.SHARED for u in utils)


def test_amd_gpus_go_to_their_pod_by_pci_address() -> None:
    """The AMD device plugin names a GPU (or a partition) by its PCI address, in any case;
    the pod gets the GPU with that address, and one not on this node is said so."""
    amd = [gpu(i, util, uuid=f"{i:08x}-0000-1000-8000-74a1aaaaaaaa",
               pci_bus_id=f"0000:c{i}:00.0") for i, util in ((1, 40.0), (2, 60.0))]
    result = attribute(snap(*amd), [alloc("a", "0000:C1:00.0", resource="amd.com/gpu"),
                                    alloc("b", "0000:c9:00.0", resource="amd.com/cpx_nps4")],
                       pods(info("a", "u-a"), info("b", "u-b")), {})
    a = next(p for p in result.pods if p.pod == "a")
    assert a.utilization_percent == 40.0
    assert [d.gpu_uuid for d in a.devices] == [amd[0].uuid]
    assert "1 allocated device(s) not seen on this node" in result.reasons
    assert result.idle_gpus == (amd[1].uuid,)


@pytest.mark.parametrize(("raw", "ok"), [
    ("0000:c1:00.0", True), ("0000:C1:00.7", True), ("0000:c1:00.0::2", True),
    ("c1:00.0", False), ("0000:c1:00.8", False), ("0000:c1:00", False)])
def test_pci_device_ids_parse_strictly(raw: str, ok: bool) -> None:
    if ok:
        ref = parse_device_id(raw)
        assert ref.uuid == raw.split("::", maxsplit=1)[0].lower()
    else:
        with pytest.raises(DeviceIdError):
            parse_device_id(raw)


def test_amd_resource_names_are_gpus() -> None:
    for name in ("amd.com/gpu", "amd.com/cpx_nps4", "amd.com/spx_nps1"):
        assert is_gpu_resource(name)
    assert not is_gpu_resource("amd.com/fpga")


def test_a_pod_with_a_device_nobody_can_read_has_no_sum() -> None:
    """A device ID in no form we read beside one matched, or two devices sharing one PCI
    address: the pod's sums are unknown, never those of the one device that was matched,
    and the unmatched ID is named."""
    amd = gpu(1, 40.0, uuid="00000001-0000-1000-8000-74a1aaaaaaaa", pci_bus_id="0000:c1:00.0")
    unreadable = DeviceRef("amdgpu_part_1", DeviceKind.UNKNOWN, "")
    alloc_two = Allocation("ns", "a", "c", "amd.com/cpx_nps4",
                           (parse_device_id("0000:c1:00.0"), unreadable))
    (p,) = attribute(snap(amd), [alloc_two], pods(info("a", "u-a")), {}).pods
    assert (p.utilization_percent, p.memory_used_bytes) == (Absent.NO_DATA, Absent.NO_DATA)
    assert p.unmatched == ("amdgpu_part_1",)
    twins = [gpu(i, 40.0, uuid=f"{i:08x}-0000-1000-8000-74a1aaaaaaaa",
                 pci_bus_id="0000:c1:00.0") for i in (1, 2)]
    (p,) = attribute(snap(*twins), [alloc("a", "0000:c1:00.0", resource="amd.com/gpu")],
                     pods(info("a", "u-a")), {}).pods
    assert p.utilization_percent is Absent.NO_DATA


def partitioned(util: float, busy: tuple[float | Absent, ...],
                names: tuple[str, ...]) -> GpuSample:
    """An AMD GPU in a partition mode: its own PCI address, one partition per name."""
    parts = tuple(MigSample(f"{p:08x}-0000-1000-8000-74a1bbbbbbbb", uuid(0), p, p, 0,
                            "cpx.nps1", GIB, 24 * GIB, b, device_id=n)
                  for p, (b, n) in enumerate(zip(busy, names, strict=True)))
    return gpu(0, util, pci_bus_id="0000:c1:00.0", mig_enabled=True,
               sharing=SharingMode.MIG, migs=parts)


def test_amd_partitions_go_to_their_pod_by_the_device_plugins_name() -> None:
    """The GPU's own PCI address is its first partition; amdgpu_xcp_<n> the others. Each
    pod gets its partition's busy share, not the GPU's average."""
    g = partitioned(12.0, (90.0, 0.0, 6.0), ("0000:c1:00.0", "amdgpu_xcp_0", "amdgpu_xcp_1"))
    result = attribute(snap(g), [alloc("a", "0000:C1:00.0", resource="amd.com/cpx_nps1"),
                                 alloc("b", "amdgpu_xcp_1", resource="amd.com/cpx_nps1")],
                       pods(info("a", "u-a"), info("b", "u-b")), {})
    got = {p.pod: p for p in result.pods}
    assert (got["a"].utilization_percent, got["b"].utilization_percent) == (90.0, 6.0)
    assert got["a"].devices[0].mig_profile == "cpx.nps1"
    assert result.idle_gpus == (g.migs[1].uuid,)
    assert result.state is AttributionState.OK


def test_a_partitioned_gpus_address_is_never_the_whole_gpu() -> None:
    # Partition names unreadable (no /sys): the PCI address must not fall back to the
    # whole GPU, whose 12 % averages a 90 % partition with idle ones.
    g = partitioned(12.0, (90.0, 0.0), ("", ""))
    (p,) = attribute(snap(g), [alloc("a", "0000:c1:00.0", resource="amd.com/cpx_nps1")],
                     pods(info("a", "u-a")), {}).pods
    assert p.utilization_percent is Absent.NO_DATA
    assert p.unmatched == ("0000:c1:00.0",)


def test_amd_partition_ids_parse_strictly() -> None:
    ref = parse_device_id("amdgpu_xcp_12")
    assert (ref.kind, ref.uuid) == (DeviceKind.PLATFORM, "amdgpu_xcp_12")
    for raw in ("amdgpu_xcp_", "amdgpu_xcp_1a", "AMDGPU_XCP_1", "amdgpu_xcp_123456"):
        with pytest.raises(DeviceIdError):
            parse_device_id(raw)

