"""The NVML backend against the fake libnvidia-ml.so.1, loaded by the real nvidia-ml-py."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.peers.fakenvml import NvmlProcess, big_mig_scenario, build, gpu_line, mig_line, proc_line

GIB = 2**30
T0 = 1_700_000_000_000_000  # a frozen driver clock (epoch us), on every sample grid used here
PERIOD = 1_000_000  # sample_us: the driver's sample period in the per-process tests


def clock(us: int) -> str:
    """The scenario's first line: the driver's clock stands at ``us``."""
    return f"global clock_us={us}"


@pytest.fixture(scope="session")
def lib_dir() -> Path:
    return build()


@pytest.fixture(scope="session")
def old_lib_dir() -> Path:
    return build(old_driver=True)


@pytest.fixture
def scenario(tmp_path: Path) -> Callable[..., Path]:
    path = tmp_path / "scenario.txt"

    def write(*lines: str) -> Path:
        # Bump mtime explicitly: two writes within one timestamp tick must still reload.
        before = path.stat().st_mtime_ns if path.exists() else 0
        path.write_text("\n".join(lines) + "\n")
        st = path.stat()
        if st.st_mtime_ns <= before:
            import os

            os.utime(path, ns=(st.st_atime_ns, before + 1_000_000))
        return path

    return write


@pytest.fixture
def nvml(lib_dir: Path, scenario: Callable[..., Path]) -> Iterator[Callable[..., NvmlProcess]]:
    procs: list[NvmlProcess] = []

    def start(*lines: str, args: tuple[str, ...] = (), lib: Path | None = lib_dir) -> NvmlProcess:
        p = NvmlProcess(lib, scenario(*lines), *args)
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.close()


def gpu(snap: dict[str, Any], index: int) -> dict[str, Any]:
    return next(g for g in snap["gpus"] if g["index"] == index)


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


# -- per-process utilization: the driver samples only processes that did work -----------


def procs_of(snap: dict[str, Any], index: int) -> dict[int, dict[str, Any]]:
    return {q["pid"]: q for q in gpu(snap, index)["processes"]}


def test_idle_process_listed_without_a_sample_used_zero(
        nvml: Callable[..., NvmlProcess], scenario: Callable[..., Path]) -> None:
    # A time-sliced GPU with a busy and an idle process: the driver lists both as running
    # but has an entry only for the busy one.
    gpu0 = gpu_line(0, util=40, sample_us=PERIOD)
    busy, idle = proc_line(0, 501, mem=GIB, sm=40), proc_line(0, 502, mem=2 * GIB, idle=1)
    p = nvml(clock(T0), gpu0, busy, idle)
    snap = p.sample()
    got = procs_of(snap, 0)
    assert got[501]["sm_util_percent"] == 40
    assert got[502]["sm_util_percent"] == 0.0  # not "no_data": it did no work
    assert got[502]["used_memory_bytes"] == 2 * GIB
    assert gpu(snap, 0)["processes_unknown"] is None
    assert snap["problems"] == []
    # The clock has not reached the next sample (a tick shorter than the driver's period):
    # the last window's values stand, and a process new since reads no_data, not 0.
    scenario(clock(T0), gpu0, busy, idle, proc_line(0, 503, mem=GIB, sm=70))
    got = procs_of(p.sample(), 0)
    assert [got[pid]["sm_util_percent"] for pid in (501, 502, 503)] == [40, 0.0, "no_data"]
    scenario(clock(T0 + PERIOD), gpu0, busy, idle, proc_line(0, 503, mem=GIB, sm=70))
    got = procs_of(p.sample(), 0)
    assert [got[pid]["sm_util_percent"] for pid in (501, 502, 503)] == [40, 0.0, 70]


def test_all_processes_idle_the_driver_says_not_found_and_each_used_zero(
        nvml: Callable[..., NvmlProcess]) -> None:
    p = nvml(gpu_line(0, util=0), proc_line(0, 601, mem=GIB, sm=0),
             proc_line(0, 602, mem=GIB, idle=1, sm=30))
    snap = p.sample()
    assert {pid: q["sm_util_percent"] for pid, q in procs_of(snap, 0).items()} == {
        601: 0.0, 602: 0.0}
    assert snap["problems"] == []  # NOT_FOUND is an answer, not a failure


def test_a_process_that_goes_idle_reads_zero_from_the_next_driver_sample(
        nvml: Callable[..., NvmlProcess], scenario: Callable[..., Path]) -> None:
    # Before, the cursor stopped at the newest entry and a busy value was held for 5 s past
    # the newest entry of any process: once all were idle (NOT_FOUND on every call) the last
    # busy value stood forever.
    gpu0 = gpu_line(0, util=60, sample_us=PERIOD)
    p = nvml(clock(T0), gpu0, proc_line(0, 701, mem=GIB, sm=60))
    assert procs_of(p.sample(), 0)[701]["sm_util_percent"] == 60
    scenario(clock(T0), gpu0, proc_line(0, 701, mem=GIB, sm=0))  # idle from T0 on
    assert procs_of(p.sample(), 0)[701]["sm_util_percent"] == 60  # no new sample yet
    scenario(clock(T0 + 2 * PERIOD), gpu0, proc_line(0, 701, mem=GIB, sm=0))
    assert procs_of(p.sample(), 0)[701]["sm_util_percent"] == 0.0
    scenario(clock(T0 + 60 * PERIOD), gpu0, proc_line(0, 701, mem=GIB, sm=0))
    assert procs_of(p.sample(), 0)[701]["sm_util_percent"] == 0.0


def test_the_first_read_is_the_last_interval_not_the_drivers_long_window(
        nvml: Callable[..., NvmlProcess]) -> None:
    # Busy for the last 3 s after 60 s idle. Asked from timestamp 0, the driver averages its
    # whole window (72 periods): 3 busy of 72 -> 4 %, while the process runs at 99 % (on an
    # H100: 46 % for a process at 99 %). The first read must cover the last interval only.
    p = nvml(clock(T0), gpu_line(0, util=99, sample_us=PERIOD),
             proc_line(0, 711, mem=GIB, sm=99, was=0, for_ms=3000))
    assert procs_of(p.sample(), 0)[711]["sm_util_percent"] == 99


def test_a_process_busy_part_of_the_window_reads_its_mean_over_the_window(
        nvml: Callable[..., NvmlProcess], scenario: Callable[..., Path]) -> None:
    gpu0 = gpu_line(0, util=50, sample_us=PERIOD)
    p = nvml(clock(T0), gpu0, proc_line(0, 721, mem=GIB, sm=80))
    assert procs_of(p.sample(), 0)[721]["sm_util_percent"] == 80
    # Idle from the period that ends at T0 + 2: busy in the first of the window's two.
    scenario(clock(T0 + 2 * PERIOD), gpu0, proc_line(0, 721, mem=GIB, sm=0))
    assert procs_of(p.sample(), 0)[721]["sm_util_percent"] == 40


@pytest.mark.parametrize(("fault", "state", "problem"), [
    ("fail=proc_util:999", "unavailable",
     ["gpu 0: process_utilization: unavailable (NVML_ERROR_UNKNOWN)"]),
    ("fail=proc_util:3", "unsupported", []),
    ("unsupported=proc_util", "unsupported", []),
])
def test_per_process_utilization_failing_is_absent_never_zero(
        nvml: Callable[..., NvmlProcess], fault: str, state: str, problem: list[str]) -> None:
    key, value = fault.split("=")
    p = nvml(gpu_line(0, util=50, **{key: value}), proc_line(0, 801, mem=GIB, sm=50),
             proc_line(0, 802, mem=GIB, idle=1))
    for _ in range(2):
        snap = p.sample()
        got = procs_of(snap, 0)
        assert [got[pid]["sm_util_percent"] for pid in (801, 802)] == [state, state]
        assert got[802]["used_memory_bytes"] == GIB  # the list itself was read
        assert gpu(snap, 0)["processes_unknown"] is None
        assert snap["problems"] == problem


def test_process_list_failing_is_unknown_not_empty(nvml: Callable[..., NvmlProcess]) -> None:
    p = nvml(gpu_line(0, util=50, fail="processes:999"), proc_line(0, 901, mem=GIB, sm=50))
    g = gpu(p.sample(), 0)
    assert g["processes"] == []
    assert g["processes_unknown"] == "unavailable"


def test_graphics_contexts_are_listed_too(nvml: Callable[..., NvmlProcess]) -> None:
    p = nvml(gpu_line(0, util=50), proc_line(0, 1001, mem=GIB, sm=20),
             proc_line(0, 1002, mem=2 * GIB, sm=30, ctx="graphics"),
             proc_line(0, 1003, mem=3 * GIB, ctx="both", idle=1))
    got = procs_of(p.sample(), 0)
    assert {pid: (q["used_memory_bytes"], q["sm_util_percent"]) for pid, q in got.items()} == {
        1001: (GIB, 20), 1002: (2 * GIB, 30), 1003: (3 * GIB, 0.0)}


def test_mig_processes_have_unsupported_utilization_never_zero(
        nvml: Callable[..., NvmlProcess]) -> None:
    # On MIG the driver has no per-process (nor device) utilization: an unsampled process
    # there is not an idle one. No GPM on this part either.
    p = nvml(gpu_line(0, mig=1), mig_line(0, 0, gi=1, gslices=3, mem_mb=40192),
             proc_line(0, 1101, mig=0, mem=GIB, sm=50), proc_line(0, 1102, mig=0, mem=GIB))
    snap = p.sample()
    g = gpu(snap, 0)
    (m,) = g["migs"]
    assert m["utilization_percent"] == "unsupported"
    assert m["processes_unknown"] is None
    assert {q["pid"]: q["sm_util_percent"] for q in m["processes"]} == {
        1101: "unsupported", 1102: "unsupported"}
    assert g["processes_unknown"] is None
    assert snap["problems"] == []


def test_gpu_lost_in_the_middle_of_a_tick(nvml: Callable[..., NvmlProcess],
                                          scenario: Callable[..., Path]) -> None:
    # GPU 0 falls off the bus between listing its processes and reading their utilization:
    # nothing of that tick survives as a reading, least of all an empty process list.
    lost = gpu_line(0, util=70, lost_after="proc_util:1")
    procs = [proc_line(0, 1201, mem=GIB, sm=70), proc_line(0, 1202, mem=GIB, idle=1)]
    p = nvml(lost, gpu_line(1, util=20), *procs)
    snap = p.sample()
    assert [g["state"] for g in snap["gpus"]] == ["lost", "ok"]
    g0 = gpu(snap, 0)
    assert g0["processes"] == []
    assert g0["processes_unknown"] == "lost"
    assert g0["utilization_percent"] == "lost"
    assert gpu(p.sample(), 0)["state"] == "lost"  # lost stays lost
    scenario(gpu_line(0, util=70), gpu_line(1, util=20), *procs)
    back = p.sample()
    assert gpu(back, 0)["state"] == "ok"
    assert gpu(back, 0)["processes_unknown"] is None


def test_mig_gpu_lost_in_the_middle_of_a_tick_keeps_its_instances_as_lost(
        nvml: Callable[..., NvmlProcess]) -> None:
    # Lost while listing the second instance's processes: both instances are still in the
    # sample, lost, so a pod holding one reads as lost and not as holding nothing.
    p = nvml(gpu_line(0, mig=1, lost_after="processes:2"),
             mig_line(0, 0, gi=1, gslices=3, mem_mb=40192),
             mig_line(0, 1, gi=2, gslices=3, mem_mb=40192),
             proc_line(0, 1301, mig=0, mem=GIB), proc_line(0, 1302, mig=1, mem=GIB))
    g = gpu(p.sample(), 0)
    assert g["state"] == "lost"
    assert [(m["gpu_instance_id"], m["profile"]) for m in g["migs"]] == [
        (1, "3g.40gb"), (2, "3g.40gb")]
    assert {m["utilization_percent"] for m in g["migs"]} == {"lost"}
    assert {m["memory_used_bytes"] for m in g["migs"]} == {"lost"}
    assert {m["processes_unknown"] for m in g["migs"]} == {"lost"}
    p.close()  # the GPM-less instances own no buffers; close must not trip on the lost GPU


def test_mig_gpu_lost_while_re_enumerating_keeps_its_last_layout(
        nvml: Callable[..., NvmlProcess]) -> None:
    # Seven handle lookups per enumeration (one per possible position): the 8th is the first
    # of the second tick's re-enumeration. The half-read layout must not replace the last one.
    p = nvml(gpu_line(0, mig=1, gpm=1, lost_after="mig_handle:8"),
             mig_line(0, 0, gi=1, gslices=3, mem_mb=40192, gpm_util=10),
             mig_line(0, 1, gi=2, gslices=3, mem_mb=40192, gpm_util=20),
             args=("--mig-refresh", "0"))
    assert gpu(p.sample(), 0)["state"] == "ok"
    g = gpu(p.sample(), 0)
    assert g["state"] == "lost"
    assert [(m["gpu_instance_id"], m["utilization_percent"]) for m in g["migs"]] == [
        (1, "lost"), (2, "lost")]
    p.close()


MPS_SERVER = 4100000  # the fake's MPS server pid on GPU 0 (gpu_line's default)


def test_mps_clients_are_listed_with_their_own_utilization(
        nvml: Callable[..., NvmlProcess]) -> None:
    # Under MPS the compute listing shows only the MPS server; the pods' processes are what
    # the MPS listing gives. Before, only compute and graphics were read: the clients were
    # missing and their pods read 0.
    p = nvml(gpu_line(0, util=70), proc_line(0, 1101, mem=GIB, sm=30, mps=1),
             proc_line(0, 1102, mem=2 * GIB, sm=40, mps=1),
             proc_line(0, 1103, mem=GIB, idle=1, mps=1))
    snap = p.sample()
    got = procs_of(snap, 0)
    assert {pid: (q["used_memory_bytes"], q["sm_util_percent"]) for pid, q in got.items()} == {
        MPS_SERVER: (32 * 2**20, 0.0), 1101: (GIB, 30), 1102: (2 * GIB, 40), 1103: (GIB, 0.0)}
    assert [pid for pid, q in got.items() if q["mps_client"]] == [1101, 1102, 1103]
    assert gpu(snap, 0)["processes_unknown"] is None
    assert snap["problems"] == []


def test_mps_client_work_booked_to_the_server_is_shared_never_zero(
        nvml: Callable[..., NvmlProcess]) -> None:
    # Should a driver sample the MPS server rather than its clients, a client without an
    # entry of its own may have done the server's work: unknown, not idle.
    p = nvml(gpu_line(0, util=70, mps_server_sm=70), proc_line(0, 1111, mem=GIB, idle=1, mps=1),
             proc_line(0, 1112, mem=GIB, idle=1, mps=1))
    got = procs_of(p.sample(), 0)
    assert [got[pid]["sm_util_percent"] for pid in (MPS_SERVER, 1111, 1112)] == [
        70, "shared", "shared"]


@pytest.mark.parametrize(("fault", "state", "problem"), [
    ("fail=mps:999", "unavailable",
     ["gpu 0: mps_processes: unavailable (NVML_ERROR_UNKNOWN)"]),
    # Unlike graphics, an unlistable MPS is no empty one: nothing in NVML tells an MPS
    # server from any compute process, so its clients may be there unseen.
    ("fail=mps:3", "unsupported", []),
])
def test_mps_listing_failing_is_unknown_not_empty(
        nvml: Callable[..., NvmlProcess], fault: str, state: str, problem: list[str]) -> None:
    key, value = fault.split("=")
    p = nvml(gpu_line(0, util=50, **{key: value}), proc_line(0, 1121, mem=GIB, sm=50, mps=1))
    snap = p.sample()
    g = gpu(snap, 0)
    assert g["processes"] == []
    assert g["processes_unknown"] == state
    assert snap["problems"] == problem

