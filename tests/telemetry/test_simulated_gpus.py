"""The simulated backend reports what the hardware would, as a function of scenario time."""

from __future__ import annotations

import pytest

from gpuscale.telemetry.catalog import MIB
from gpuscale.telemetry.model import Absent, SharingMode
from gpuscale.telemetry.nvml_mig import mig_memory_gb
from gpuscale.telemetry.scenario import load_scenario, parse_scenario
from gpuscale.telemetry.simulated_gpus import SimulatedBackend


def backend(name: str, t: float = 0.0) -> SimulatedBackend:
    clock = [1000.0 + t]
    return SimulatedBackend(load_scenario(name).nodes[0], clock=lambda: clock[0], start=1000.0)


def test_whole_gpus_follow_their_process_load() -> None:
    snap = backend("h100-vllm").sample()
    assert len(snap.gpus) == 8
    g4 = snap.gpus[4]
    assert g4.utilization_percent == 96.0
    assert g4.memory_total_bytes == 81559 * MIB
    assert g4.memory_used_bytes == 72000 * MIB
    assert g4.power_limit_watts == 700.0
    assert snap.gpus[7].utilization_percent == 0.0  # nothing runs there: a real 0
    assert snap.gpus[7].processes == ()
    assert [p.pid for p in g4.processes] == [5201]


def test_time_sliced_processes_share_one_gpu() -> None:
    snap = backend("timesliced-node").sample()
    g0, g1 = snap.gpus[0], snap.gpus[1]
    assert g0.sharing is SharingMode.TIME_SLICED
    assert sorted(p.sm_util_percent for p in g0.processes) == [  # type: ignore[type-var]
        5.0, 5.0, 10.0, 20.0]
    # Two processes asking for 80 + 70 %: each gets its proportional share of 100 %.
    assert g1.utilization_percent == 100.0
    assert [round(p.sm_util_percent, 2) for p in g1.processes] == [  # type: ignore[arg-type]
        53.33, 46.67]


def test_mig_utilization_is_gpm_on_hopper_and_unsupported_on_ampere() -> None:
    snap = backend("mig-node").sample()
    h100, a100 = snap.gpus[0], snap.gpus[2]
    assert h100.utilization_percent is Absent.UNSUPPORTED
    assert [m.profile for m in h100.migs] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    assert h100.migs[2].utilization_percent == 80.0
    assert h100.migs[3].utilization_percent == 0.0
    assert all(m.utilization_percent is Absent.UNSUPPORTED for m in a100.migs)
    assert len(a100.migs) == 7
    assert {p.pid for p in h100.processes} == {p.pid for m in h100.migs for p in m.processes}
    assert all(p.sm_util_percent is Absent.UNSUPPORTED for p in h100.processes)


def test_readings_move_with_time_and_energy_integrates_power() -> None:
    clock = [0.0]
    b = SimulatedBackend(load_scenario("h100-vllm").nodes[0], clock=lambda: clock[0], start=0)
    first = b.sample()
    clock[0] = 150.0  # a quarter of the 600 s sine period later
    second = b.sample()
    assert first.gpus[0].utilization_percent == pytest.approx(55.0)
    assert second.gpus[0].utilization_percent == pytest.approx(90.0)
    e0, e1 = first.gpus[4].energy_millijoules, second.gpus[4].energy_millijoules
    assert isinstance(e0, int)
    assert isinstance(e1, int)
    power = first.gpus[4].power_watts
    assert isinstance(power, float)
    assert e1 - e0 == pytest.approx(150 * power * 1000, rel=1e-6)


def test_same_time_same_readings() -> None:
    a, b = backend("mig-node", 42.0).sample(), backend("mig-node", 42.0).sample()
    assert [g.migs for g in a.gpus] == [g.migs for g in b.gpus]
    assert a.gpus[0].uuid == b.gpus[0].uuid


def test_nodes_of_a_fleet_differ() -> None:
    doc = {"nodes": [{"name": f"n{i}", "gpus": [{"model": "L4"}]} for i in range(3)]}
    scenario = parse_scenario(doc)
    uuids = {SimulatedBackend(n).sample().gpus[0].uuid for n in scenario.nodes}
    assert len(uuids) == 3


@pytest.mark.parametrize(("instance_mib", "total_mib", "gb"), [
    (9984, 81559, 10), (19968, 81559, 20), (40192, 81559, 40), (80384, 81559, 80),  # H100
    (4864, 40960, 5), (9984, 40960, 10), (19968, 40960, 20),  # A100 40GB
    (9728, 81920, 10), (40192, 81920, 40),  # A100 80GB
])
def test_mig_profile_memory_matches_the_device_plugin_names(
        instance_mib: int, total_mib: int, gb: int) -> None:
    assert mig_memory_gb(instance_mib, total_mib * MIB) == gb
