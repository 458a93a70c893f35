"""The collector: dcgm-compatible families from a snapshot; absent readings emit nothing."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuscale.agent.exporter import MAX_PROCESS_SERIES_PER_GPU, SnapshotCollector
from gpuscale.attribution.devices import parse_device_id
from gpuscale.attribution.model import (
    AttributionState,
    DeviceUsage,
    NodeAttribution,
    PodUsage,
)
from gpuscale.telemetry.model import (
    Absent,
    BackendState,
    GpuSample,
    GpuState,
    MigSample,
    NodeSnapshot,
    ProcessSample,
    SharingMode,
)

MIB = 2**20


Samples = dict[str, list[tuple[dict[str, str], float]]]


def render(snap: NodeSnapshot | None, now: float = 100.0) -> Samples:
    return render_with(snap, None, now)


def render_with(snap: NodeSnapshot | None, att: NodeAttribution | None,
                now: float = 100.0) -> Samples:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: snap, "node-a", monotonic=lambda: now,
                                        attribution=lambda: att))
    text = generate_latest(registry).decode()
    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def gpu(**kw: object) -> GpuSample:
    base: dict[str, object] = {"index": 0, "uuid": "GPU-a", "name": "NVIDIA L4",
                               "pci_bus_id": "00000000:18:00.0", "minor_number": 2}
    base.update(kw)
    return GpuSample(**base)  # type: ignore[arg-type]


def snapshot(*gpus: GpuSample, **kw: object) -> NodeSnapshot:
    fields: dict[str, object] = {"backend": "sim", "driver_version": "550", **kw}
    return NodeSnapshot(node="n", taken_at=1.7e9, monotonic=99.0, seq=4, gpus=gpus,
                        **fields)  # type: ignore[arg-type]


def test_dcgm_names_units_and_labels() -> None:
    m = render(snapshot(gpu(utilization_percent=42.5, memory_used_bytes=1024 * MIB,
                            memory_free_bytes=512 * MIB, power_watts=71.5,
                            temperature_c=55.0, sm_clock_mhz=2040.0,
                            energy_millijoules=123456, last_xid=79, xid_errors_total=2)))
    labels, value = m["DCGM_FI_DEV_GPU_UTIL"][0]
    assert labels == {"gpu": "0", "UUID": "GPU-a", "pci_bus_id": "00000000:18:00.0",
                      "device": "nvidia2", "modelName": "NVIDIA L4", "Hostname": "node-a"}
    assert value == 42.5
    assert m["DCGM_FI_DEV_FB_USED"][0][1] == 1024.0  # MiB, as dcgm-exporter
    assert m["DCGM_FI_DEV_FB_FREE"][0][1] == 512.0
    assert m["DCGM_FI_DEV_POWER_USAGE"][0][1] == 71.5
    assert m["DCGM_FI_DEV_GPU_TEMP"][0][1] == 55.0
    assert m["DCGM_FI_DEV_SM_CLOCK"][0][1] == 2040.0
    assert m["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"][0][1] == 123456.0
    assert m["DCGM_FI_DEV_XID_ERRORS"][0][1] == 79.0
    assert m["gpuscale_gpu_xid_errors_total"][0][1] == 2.0
    assert m["gpuscale_gpu_energy_joules_total"][0][1] == 123.456
    assert m["gpuscale_agent_snapshot_age_seconds"][0][1] == 1.0
    assert m["gpuscale_agent_backend_up"] == [({"backend": "sim"}, 1.0)]


def test_absent_readings_emit_no_sample_but_say_why() -> None:
    m = render(snapshot(gpu(utilization_percent=Absent.UNSUPPORTED,
                            power_watts=Absent.UNAVAILABLE, temperature_c=30.0)))
    assert "DCGM_FI_DEV_GPU_UTIL" not in m
    assert "DCGM_FI_DEV_POWER_USAGE" not in m
    reasons = {(lab["reading"], lab["reason"]) for lab, _ in m["gpuscale_gpu_reading_absent"]}
    assert ("utilization", "unsupported") in reasons
    assert ("power", "unavailable") in reasons
    assert ("temperature", "unsupported") not in reasons


def test_lost_gpu_is_down_and_has_no_readings() -> None:
    lost = Absent.LOST
    m = render(snapshot(gpu(state=GpuState.LOST, utilization_percent=lost,
                            memory_used_bytes=lost, power_watts=lost)))
    assert m["gpuscale_gpu_up"][0][1] == 0.0
    assert "DCGM_FI_DEV_GPU_UTIL" not in m
    assert "DCGM_FI_DEV_XID_ERRORS" not in m
    assert m["gpuscale_gpu_info"][0][0]["state"] == "lost"


def test_mig_instances_carry_profile_labels_and_no_double_counting() -> None:
    migs = tuple(MigSample(f"MIG-{i}", "GPU-a", i, i + 1, 0, "3g.40gb", 10 * MIB * (i + 1),
                           40192 * MIB, 55.0 if i == 0 else Absent.UNSUPPORTED)
                 for i in range(2))
    m = render(snapshot(gpu(mig_enabled=True, sharing=SharingMode.MIG, migs=migs,
                            memory_used_bytes=1000 * MIB, memory_free_bytes=MIB,
                            utilization_percent=Absent.UNSUPPORTED)))
    fb = m["DCGM_FI_DEV_FB_USED"]
    assert [(lab["GPU_I_PROFILE"], lab["GPU_I_ID"], v) for lab, v in fb] == [
        ("3g.40gb", "1", 10.0), ("3g.40gb", "2", 20.0)]  # per instance only
    assert m["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] == [
        ({**fb[0][0]}, 0.55)]
    absent = {(lab["GPU_I_ID"], lab["reading"]) for lab, _ in m["gpuscale_gpu_reading_absent"]}
    assert ("2", "utilization") in absent


def test_process_series_are_bounded_largest_first() -> None:
    procs = tuple(ProcessSample(pid, pid * MIB, 1.0) for pid in range(1, 200))
    m = render(snapshot(gpu(processes=procs)))
    series = m["gpuscale_process_gpu_memory_used_bytes"]
    assert len(series) == MAX_PROCESS_SERIES_PER_GPU
    assert min(int(lab["pid"]) for lab, _ in series) == 199 - MAX_PROCESS_SERIES_PER_GPU + 1


def test_before_first_sample_and_when_backend_down() -> None:
    assert list(render(None)) == []  # backend_up has no sample before the first snapshot
    m = render(snapshot(state=BackendState.UNAVAILABLE, reason="NVML_ERROR_DRIVER_NOT_LOADED"))
    assert m["gpuscale_agent_backend_up"] == [({"backend": "sim"}, 0.0)]
    assert "DCGM_FI_DEV_GPU_UTIL" not in m


def test_amd_gpus_get_amds_exporter_series_and_only_the_dcgm_ones_that_mean_the_same(
        ) -> None:
    mi = gpu(uuid="00000000-0000-1000-8000-74a1aaaaaaaa", name="AMD Instinct MI300X",
             pci_bus_id="0000:05:00.0", minor_number=-1, utilization_percent=37.0,
             memory_util_percent=12.0, memory_used_bytes=51200 * MIB,
             memory_total_bytes=196592 * MIB, memory_free_bytes=145392 * MIB,
             power_watts=410.0, temperature_c=55.0)
    got = render(snapshot(mi, backend="amdsmi"))
    labels = {"gpu_id": "0", "gpu_partition_id": "0", "card_model": "AMD Instinct MI300X",
              "hostname": "node-a"}
    for name, value in (("gpu_gfx_activity", 37.0), ("gpu_umc_activity", 12.0),
                        ("gpu_used_vram", 51200.0), ("gpu_total_vram", 196592.0),
                        ("gpu_free_vram", 145392.0), ("gpu_package_power", 410.0),
                        ("gpu_junction_temperature", 55.0)):
        assert got[name] == [(labels, value)], name
    (util,) = got["DCGM_FI_DEV_GPU_UTIL"]
    assert util[0]["device"] == "amdgpu0"
    assert util[1] == 37.0
    assert got["DCGM_FI_DEV_FB_USED"][0][1] == 51200.0
    assert got["DCGM_FI_DEV_POWER_USAGE"][0][1] == 410.0
    # Not the same meaning on an MI300: no edge temperature, copy engine or clock series.
    for name in ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_SM_CLOCK"):
        assert name not in got
    # And an NVIDIA node has none of AMD's.
    assert "gpu_gfx_activity" not in render(snapshot(gpu(utilization_percent=5.0)))


def test_a_partitioned_amd_gpu_is_one_gpu_id_per_partition_as_amds_exporter_has_it() -> None:
    """An MI300X in CPX mode (2 of its partitions here) after a whole MI300X: gpu_id counts
    processors as amdsmi enumerates them; VRAM per partition, never also the GPU's (a sum
    counts it once); the GPU's activity, power and temperature on partition 0 only; each
    partition's own busy share in the MIG series."""
    whole = gpu(uuid="w", name="AMD Instinct MI300X", pci_bus_id="0000:05:00.0",
                minor_number=-1, utilization_percent=5.0, memory_used_bytes=MIB,
                memory_total_bytes=8 * MIB)
    parts = tuple(MigSample(f"p{i}", "g", i, i, 0, "cpx.nps1", (i + 1) * MIB, 4 * MIB,
                            [90.0, 10.0][i], device_id=f"d{i}") for i in range(2))
    cpx = gpu(index=1, uuid="g", name="AMD Instinct MI300X", pci_bus_id="0000:06:00.0",
              minor_number=-1, utilization_percent=50.0, memory_used_bytes=3 * MIB,
              memory_total_bytes=8 * MIB, power_watts=400.0, temperature_c=60.0,
              mig_enabled=True, sharing=SharingMode.MIG, migs=parts)
    got = render(snapshot(whole, cpx, backend="amdsmi"))
    used = {(lab["gpu_id"], lab["gpu_partition_id"], lab.get("gpu_compute_partition_type")):
            v for lab, v in got["gpu_used_vram"]}
    assert used == {("0", "0", None): 1.0, ("1", "0", "cpx"): 1.0, ("2", "1", "cpx"): 2.0}
    assert [(lab["gpu_id"], v) for lab, v in got["gpu_gfx_activity"]] == [("0", 5.0),
                                                                         ("1", 50.0)]
    assert [(lab["gpu_id"], v) for lab, v in got["gpu_package_power"]] == [("1", 400.0)]
    assert {lab["gpu_memory_partition_type"] for lab, _ in got["gpu_total_vram"]
            if "gpu_memory_partition_type" in lab} == {"nps1"}
    assert sum(v for _, v in got["DCGM_FI_DEV_FB_USED"]) == 1.0 + 1.0 + 2.0  # once each
    # dcgm's MIG convention: no device utilization on the partitioned GPU (its 50 % average
    # would call a GPU with a 90 % partition half idle), each partition's engine activity.
    assert [lab["device"] for lab, _ in got["DCGM_FI_DEV_GPU_UTIL"]] == ["amdgpu0"]
    assert sorted(v for _, v in got["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]) == [0.1, 0.9]
    busy = {lab["GPU_I_ID"]: v for lab, v in got["gpuscale_mig_utilization_percent"]}
    assert busy == {"0": 90.0, "1": 10.0}
    # Held by a pod, partition 0 still carries the GPU's activity without the pod's name
    # (the pod's own share is its partition's 90, not the GPU's 50).
    holders = NodeAttribution(AttributionState.OK, (), (PodUsage(
        "llm", "chat-0", "engine", "amd.com/cpx_nps1",
        (DeviceUsage(parse_device_id("0000:06:00.0"), "g", 1, mig_uuid="p0"),),
        90.0, MIB, 4 * MIB),))
    held = render_with(snapshot(whole, cpx, backend="amdsmi"), holders)
    assert [lab.get("pod") for lab, _ in held["gpu_gfx_activity"]] == [None, None]
    assert {lab.get("pod") for lab, _ in held["gpu_used_vram"]} == {None, "chat-0"}
