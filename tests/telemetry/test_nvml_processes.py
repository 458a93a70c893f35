"""The NVML backend's per-process readings against the fake libnvidia-ml.so.1: the driver
samples only processes that did work; MPS clients; a GPU lost in the middle of a tick."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.peers.fakenvml import NvmlProcess, gpu_line, mig_line, proc_line
from tests.telemetry.nvml_snapshots import GIB, PERIOD, T0, clock, gpu, procs_of

# -- per-process utilization: the driver samples only processes that did work -----------


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
