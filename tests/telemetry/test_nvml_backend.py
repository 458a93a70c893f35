"""The NVML backend against the fake libnvidia-ml.so.1, loaded by the real nvidia-ml-py
(per-process utilization, MPS and a GPU lost mid-tick: test_nvml_processes)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.peers.fakenvml import NvmlProcess, big_mig_scenario, gpu_line, mig_line, proc_line
from tests.telemetry.nvml_snapshots import GIB, T0, clock, gpu


def test_reads_identity_memory_power_thermals(nvml: Callable[..., NvmlProcess]) -> None:
    p = nvml(f"global driver=550.90.07 clock_us={T0}",
             gpu_line(0, minor=3, mem_used=10 * GIB, mem_reserved=GIB // 2, power_mw=312500,
                      limit_mw=700000, temp=61, sm_clock=1755, energy_mj=5000, util=40))
    snap = p.sample()
    assert snap["state"] == "ok"
    assert snap["driver_version"] == "550.90.07"
    g = gpu(snap, 0)
    assert g["uuid"] == "GPU-00000000-0000-0000-0000-000000000000"
    assert g["name"] == "NVIDIA H100 80GB HBM3"
    assert g["pci_bus_id"] == "00000000:18:00.0"
    assert g["minor_number"] == 3
    assert g["memory_used_bytes"] == 10 * GIB
    assert g["memory_reserved_bytes"] == GIB // 2
    assert g["memory_free_bytes"] == 85520809984 - 10 * GIB - GIB // 2
    assert g["power_watts"] == pytest.approx(312.5)
    assert g["power_limit_watts"] == pytest.approx(700.0)
    assert g["temperature_c"] == 61
    assert g["sm_clock_mhz"] == 1755
    assert g["energy_millijoules"] == 5000  # the clock stands at the load: nothing added
    assert g["utilization_percent"] == pytest.approx(40.0)
    assert g["pcie_tx_bytes_per_second"] == "unsupported"  # not asked for


def test_utilization_is_the_mean_of_driver_samples_since_the_cursor(
        nvml: Callable[..., NvmlProcess], scenario: Callable[..., Path]) -> None:
    # The driver's samples alternate 20 and 80 % every 50 ms (20 on the sample at T0, an
    # even one): one instantaneous read would say 20 or 80; the window average says 50.
    gpu0 = gpu_line(0, util="20,80", sample_us=50_000)
    p = nvml(clock(T0), gpu0, args=("--interval", "0.5"))
    first = gpu(p.sample(), 0)
    # First read: only the samples of the last interval (0.5 s: 10 of the 120 buffered).
    assert (first["utilization_samples"], first["utilization_percent"]) == (10, 50)
    # Three samples later (80, 20, 80): only those newer than the cursor count.
    scenario(clock(T0 + 150_000), gpu0)
    second = gpu(p.sample(), 0)
    assert (second["utilization_samples"], second["utilization_percent"]) == (3, 60)


def test_no_new_sample_falls_back_to_the_drivers_latest_value(
        nvml: Callable[..., NvmlProcess]) -> None:
    p = nvml(clock(T0), gpu_line(0, util=70, sample_us=10_000_000))  # a sample every 10 s
    p.sample()
    again = gpu(p.sample(), 0)  # the clock stands: no sample newer than the cursor
    assert again["utilization_samples"] == 0
    assert again["utilization_percent"] == 70


def test_processes_two_call_protocol_and_per_process_utilization(
        nvml: Callable[..., NvmlProcess]) -> None:
    procs = [proc_line(0, 100 + i, mem=(i + 1) * GIB, sm=5 * i, memutil=i) for i in range(64)]
    p = nvml(gpu_line(0, util=90), gpu_line(1), *procs)
    g0, g1 = gpu(p.sample(), 0), gpu(p.sample(), 1)
    assert g1["processes"] == []  # zero processes: the first call answers SUCCESS
    snap = p.sample()
    got = {q["pid"]: q for q in gpu(snap, 0)["processes"]}
    assert len(got) == 64
    assert got[107]["used_memory_bytes"] == 8 * GIB
    assert got[107]["gpu_instance_id"] is None
    # Utilization comes from samples seen on this or an earlier tick (cursor-based).
    assert got[107]["sm_util_percent"] == 35
    assert got[107]["mem_util_percent"] == 7
    assert g0["index"] == 0


def test_eight_gpus_with_seven_mig_instances(nvml: Callable[..., NvmlProcess]) -> None:
    p = nvml(big_mig_scenario(gpus=8, migs=7, procs_per_gpu=8))
    first = p.sample()
    assert len(first["gpus"]) == 8
    g = gpu(first, 5)
    assert g["mig_enabled"] is True
    assert g["sharing"] == "mig"
    # MIG mode: no device utilization - "unsupported", never 0.
    assert g["utilization_percent"] == "unsupported"
    assert len(g["migs"]) == 7
    m = g["migs"][3]
    assert m["profile"] == "1g.10gb"
    assert m["gpu_instance_id"] == 10
    assert m["compute_instance_id"] == 0
    assert m["parent_uuid"] == g["uuid"]
    assert m["uuid"] == "MIG-00050003-0000-0000-0000-000000000000"
    assert m["memory_used_bytes"] == 4 * GIB
    assert m["memory_total_bytes"] == 9984 * 2**20
    assert m["utilization_percent"] == "no_data"  # GPM needs two samples
    pids = {q["pid"] for mm in g["migs"] for q in mm["processes"]}
    assert pids == {10500 + i for i in range(8)}
    assert all(q["sm_util_percent"] == "unsupported" for q in g["processes"])
    second = p.sample()
    assert [mm["utilization_percent"] for mm in gpu(second, 5)["migs"]] == [
        0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0]


def test_mig_profiles_from_attributes(nvml: Callable[..., NvmlProcess]) -> None:
    p = nvml(gpu_line(0, mig=1),
             mig_line(0, 0, gi=2, gslices=3, mem_mb=40192),
             mig_line(0, 2, gi=5, gslices=2, cslices=1, mem_mb=19968),
             mig_line(0, 3, gi=13, gslices=1, mem_mb=9984))
    migs = gpu(p.sample(), 0)["migs"]
    assert [(m["index"], m["profile"]) for m in migs] == [
        (0, "3g.40gb"), (2, "1c.2g.20gb"), (3, "1g.10gb")]
    # No GPM on this part: utilization is unsupported on every tick, not 0.
    assert all(m["utilization_percent"] == "unsupported" for m in gpu(p.sample(), 0)["migs"])


def test_mig_layout_change_keeps_surviving_instances_continuous(
        nvml: Callable[..., NvmlProcess], scenario: Callable[..., Path]) -> None:
    parent = gpu_line(0, mig=1, gpm=1)
    a = mig_line(0, 0, gi=1, gslices=3, mem_mb=40192, gpm_util=60)
    b = mig_line(0, 1, gi=2, gslices=3, mem_mb=40192, gpm_util=30)
    p = nvml(parent, a, b, args=("--mig-refresh", "0"))
    p.sample()
    assert [m["utilization_percent"] for m in gpu(p.sample(), 0)["migs"]] == [60.0, 30.0]
    # Instance 1 destroyed, a new one created at position 4.
    scenario(parent, a, mig_line(0, 4, gi=9, gslices=1, mem_mb=9984, gpm_util=5))
    migs = gpu(p.sample(), 0)["migs"]
    assert [(m["gpu_instance_id"], m["utilization_percent"]) for m in migs] == [
        (1, 60.0), (9, "no_data")]
    assert [m["utilization_percent"] for m in gpu(p.sample(), 0)["migs"]] == [60.0, 5.0]


def test_not_supported_readings_are_unsupported_and_failures_unavailable(
        nvml: Callable[..., NvmlProcess]) -> None:
    p = nvml(gpu_line(0, unsupported="power,temp,energy", fail="clock:999,limit:4"))
    snap = p.sample()
    g = gpu(snap, 0)
    assert g["power_watts"] == "unsupported"
    assert g["temperature_c"] == "unsupported"
    assert g["energy_millijoules"] == "unsupported"
    assert g["sm_clock_mhz"] == "unavailable"
    assert g["power_limit_watts"] == "unavailable"
    assert g["nvlink_tx_bytes_per_second"] == "unsupported"
    assert sorted(snap["problems"]) == [
        "gpu 0: power_limit: unavailable (NVML_ERROR_NO_PERMISSION)",
        "gpu 0: sm_clock: unavailable (NVML_ERROR_UNKNOWN)"]
    p.sample()
    log = p.close()
    # One log line per fault, not one per tick.
    assert log.count("sm_clock: unavailable") == 1
    assert log.count("power: unsupported") == 1


def test_gpu_lost_mid_run_then_back(nvml: Callable[..., NvmlProcess],
                                    scenario: Callable[..., Path]) -> None:
    lines = [gpu_line(0, util=10), gpu_line(1, util=20), gpu_line(2, util=30)]
    p = nvml(*lines)
    assert [g["state"] for g in p.sample()["gpus"]] == ["ok", "ok", "ok"]
    scenario(lines[0], gpu_line(1, util=20, lost=1), lines[2])
    snap = p.sample()
    assert snap["state"] == "ok"
    assert [g["state"] for g in snap["gpus"]] == ["ok", "lost", "ok"]
    lost = gpu(snap, 1)
    assert lost["uuid"] == "GPU-00000001-0000-0000-0000-000000000000"
    assert lost["utilization_percent"] == "lost"
    assert lost["memory_used_bytes"] == "lost"
    assert gpu(snap, 2)["utilization_percent"] == pytest.approx(30)
    scenario(*lines)
    assert [g["state"] for g in p.sample()["gpus"]] == ["ok", "ok", "ok"]
    assert "GPU GPU-00000001-0000-0000-0000-000000000000 is lost" in p.close()


@pytest.mark.parametrize(("code", "name"), [
    (9, "NVML_ERROR_DRIVER_NOT_LOADED"),
    (18, "NVML_ERROR_LIB_RM_VERSION_MISMATCH"),
    (4, "NVML_ERROR_NO_PERMISSION"),
])
def test_init_failure_is_a_state_and_the_backend_recovers(
        nvml: Callable[..., NvmlProcess], scenario: Callable[..., Path],
        code: int, name: str) -> None:
    p = nvml(f"global init_error={code}", gpu_line(0, util=55))
    for _ in range(2):
        snap = p.sample()
        assert snap["state"] == "unavailable"
        assert snap["reason"] == name
        assert snap["gpus"] == []
    scenario(gpu_line(0, util=55))
    snap = p.sample()
    assert snap["state"] == "ok"
    assert gpu(snap, 0)["utilization_percent"] == pytest.approx(55)


def test_driver_gone_mid_run_reinitialises(nvml: Callable[..., NvmlProcess],
                                           scenario: Callable[..., Path]) -> None:
    p = nvml(gpu_line(0, util=5))
    assert p.sample()["state"] == "ok"
    scenario("global all_error=9", gpu_line(0, util=5))
    snap = p.sample()
    assert (snap["state"], snap["reason"]) == ("unavailable", "NVML_ERROR_DRIVER_NOT_LOADED")
    scenario(gpu_line(0, util=5), gpu_line(1, util=6))
    snap = p.sample()
    assert snap["state"] == "ok"
    assert len(snap["gpus"]) == 2


def test_gpu_count_change_reinitialises(nvml: Callable[..., NvmlProcess],
                                        scenario: Callable[..., Path]) -> None:
    p = nvml(gpu_line(0))
    assert len(p.sample()["gpus"]) == 1
    scenario(gpu_line(0), gpu_line(1))
    first = p.sample()
    assert (first["state"], first["reason"]) == (
        "unavailable", "GPU count changed from 1 to 2")
    assert len(p.sample()["gpus"]) == 2


def test_library_missing(nvml: Callable[..., NvmlProcess]) -> None:
    p = nvml(gpu_line(0), lib=None)
    snap = p.sample()
    assert (snap["state"], snap["reason"]) == ("unavailable", "NVML_ERROR_LIBRARY_NOT_FOUND")


def test_no_gpus(nvml: Callable[..., NvmlProcess]) -> None:
    snap = nvml("global driver=550.54.15").sample()
    assert snap["state"] == "ok"
    assert snap["gpus"] == []


def test_older_driver_without_newer_entry_points(
        nvml: Callable[..., NvmlProcess], old_lib_dir: Path) -> None:
    p = nvml(gpu_line(0, util=45, mem_used=GIB, mem_reserved=GIB),
             gpu_line(1, mig=1, gpm=1), mig_line(1, 0, gi=1, gslices=7, mem_mb=80384),
             proc_line(0, 4242, mem=GIB, sm=45), lib=old_lib_dir)
    p.sample()
    snap = p.sample()
    g = gpu(snap, 0)
    # nvmlDeviceGetMemoryInfo_v2 missing: v1 (used includes reserved; reserved unknown).
    assert g["memory_used_bytes"] == 2 * GIB
    assert g["memory_reserved_bytes"] == "unsupported"
    # nvmlDeviceGetSamples missing: the driver's latest value, no window.
    assert g["utilization_samples"] == 0
    assert g["utilization_percent"] == 45
    # GPM missing: MIG utilization unsupported, not 0.
    assert gpu(snap, 1)["migs"][0]["utilization_percent"] == "unsupported"
    # nvmlDeviceGetComputeRunningProcesses_v3 missing (pynvml raises its
    # NVMLLibraryMismatchError, no NVMLError): the process list is unsupported, not empty.
    assert (g["processes"], g["processes_unknown"]) == ([], "unsupported")
    assert snap["problems"] == []


def test_struct_version_mismatch_falls_back_to_the_v1_call(
        nvml: Callable[..., NvmlProcess]) -> None:
    p = nvml(gpu_line(0, mem_used=GIB, mem_reserved=GIB, fail="memory_v2:25"))
    for _ in range(2):
        snap = p.sample()
        g = gpu(snap, 0)
        assert g["memory_used_bytes"] == 2 * GIB
        assert g["memory_reserved_bytes"] == "unsupported"
        assert snap["problems"] == []


def test_xid_events_are_counted(nvml: Callable[..., NvmlProcess],
                                scenario: Callable[..., Path]) -> None:
    p = nvml(gpu_line(0), gpu_line(1, xid="79:2"))
    snap = p.sample()
    assert (gpu(snap, 1)["xid_errors_total"], gpu(snap, 1)["last_xid"]) == (2, 79)
    assert (gpu(snap, 0)["xid_errors_total"], gpu(snap, 0)["last_xid"]) == (0, 0)
    scenario(gpu_line(0), gpu_line(1, xid="48:3"))
    g1 = gpu(p.sample(), 1)
    assert (g1["xid_errors_total"], g1["last_xid"]) == (3, 48)
    assert "XID 79" in p.close()


def test_nvlink_throughput_is_differenced_from_counters(
        nvml: Callable[..., NvmlProcess], scenario: Callable[..., Path]) -> None:
    # Both clocks frozen and stepped together: the driver's counters (KiB since the load)
    # move by 0.5 s worth, the backend's monotonic clock by 0.5 s.
    gpu0 = gpu_line(0, nvlink_kib_s=4096)
    p = nvml(clock(T0), gpu0, args=("--frozen-monotonic",))
    first = gpu(p.sample(), 0)
    assert first["nvlink_tx_bytes_per_second"] == "no_data"  # one counter read is no rate
    scenario(clock(T0 + 500_000), gpu0)
    p.ask("advance 0.5")
    second = gpu(p.sample(), 0)
    # 2048 KiB tx and 4096 KiB rx over 0.5 s.
    assert second["nvlink_tx_bytes_per_second"] == 4096 * 1024
    assert second["nvlink_rx_bytes_per_second"] == 2 * 4096 * 1024
    # The clocks stand: the counters did not move, and no time passed - no rate, not 0.
    third = gpu(p.sample(), 0)
    assert third["nvlink_tx_bytes_per_second"] == "no_data"


def test_pcie_only_when_enabled(nvml: Callable[..., NvmlProcess]) -> None:
    p = nvml(gpu_line(0, pcie_kb_s=500), args=("--pcie",))
    g = gpu(p.sample(), 0)
    assert g["pcie_tx_bytes_per_second"] == 500 * 1024
    assert g["pcie_rx_bytes_per_second"] == 1000 * 1024


def test_gpus_table_shows_unsupported_not_zero(nvml: Callable[..., NvmlProcess]) -> None:
    p = nvml(gpu_line(0, mig=1), mig_line(0, 0, gi=1, gslices=7, mem_mb=80384),
             proc_line(0, 4242, mig=0, mem=GIB))
    table = p.ask("gpus")["table"]
    assert "unsupported" in table
    assert "7g.80gb" in table
    assert "pid 4242" in table
