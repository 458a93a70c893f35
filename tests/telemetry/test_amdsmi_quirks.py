"""The AMD library's quirks, each reproduced by the fake libamd_smi.so under the real
``amdsmi`` package, and the promise under each: a pod's number is what it really uses, or
UNAVAILABLE with a reason a person can act on - never a smaller number.

Partition VRAM reported as the whole pool (ROCm issue 4750) or a memory partition's pool,
the power cap in microwatts, VRAM used 0 with success after a failed read, partitions
sharing one UUID before ROCm 7.12, a library older than the package, and a repartition
under a running agent."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.peers.fakeamdsmi import build, env, gpu_line, partitioned_gpu, proc_line, xcp_name
from tests.support.sysfs import drm_tree

MIB = 1024 * 1024
PART = 196592 // 8  # an MI300X CPX partition's own VRAM, MiB

# One tick of the backend, then the agent's attribution rules and pod records on it: the
# device plugin gave pod "p<k>" partition k (or the whole GPU at 0000:05:00.0: "p0").
POD_SIGNALS = """
import json, logging, sys
logging.basicConfig(level=logging.INFO)
from pathlib import Path
from gpuscale.agent.report import pod_records
from gpuscale.attribution.devices import parse_device_id
from gpuscale.attribution.model import Allocation, PodInfo
from gpuscale.attribution.rules import attribute
from gpuscale.cli.gpus import snapshot_to_json
from gpuscale.telemetry.amdsmi_backend import AmdSmiBackend
backend = AmdSmiBackend("n", sys_root=Path(sys.argv[1]))
snap = backend.sample()
if len(sys.argv) > 3:  # the node changes: a second tick
    Path(sys.argv[4]).write_text(Path(sys.argv[3]).read_text())
    snap = backend.sample()
held = json.loads(sys.argv[2])
allocs = [Allocation("ns", pod, "c", "amd.com/gpu", (parse_device_id(dev),))
          for pod, dev in held.items()]
pods = {("ns", pod): PodInfo("ns", pod, "uid-" + pod, ready=True) for pod in held}
att = attribute(snap, allocs, pods, {})
out = {r.name: {k: (v.value if hasattr(v, "value") else v) for k, v in r.signals.items()}
       | {"reasons": dict(r.reasons)} for r in pod_records(snap, att, snap.taken_at)}
print(json.dumps({"snapshot": snapshot_to_json(snap), "pods": out}))
"""


@pytest.fixture(scope="module")
def rocm() -> Path:
    return build()


def pods(rocm: Path, tmp_path: Path, lines: list[str], names: dict[int, str],
         held: dict[str, str], later: list[str] | None = None,
         **extra: str) -> tuple[dict[str, Any], dict[str, Any], str]:
    """The snapshot and each pod's signals (and reasons) after one tick, or after a second
    one on the ``later`` lines."""
    config, again = tmp_path / "node.txt", tmp_path / "later.txt"
    config.write_text("\n".join(lines) + "\n")
    then = []
    if later is not None:
        again.write_text("\n".join(later) + "\n")
        then = [str(again), str(config)]
    got = subprocess.run([sys.executable, "-c", POD_SIGNALS,
                          str(drm_tree(tmp_path / "sys", names)), json.dumps(held), *then],
                         capture_output=True, text=True, timeout=60, check=False,
                         env=env(rocm, config, **extra))
    assert got.returncode == 0, got.stderr
    result = json.loads(got.stdout)
    return result["snapshot"], result["pods"], got.stderr


def cpx(report: str, memory: str = "NPS1", **kw: Any) -> tuple[list[str], dict[int, str]]:
    """An MI300X in CPX whose partition 0 is filled (24000 of its 24574 MiB, 97.7 %) by one
    process, partition 3 holds 1024 MiB, the others the driver's 284 MiB each."""
    lines, names = partitioned_gpu(0, memory=memory, busy=(95, 0, 0, 10), vram_report=report,
                                   **kw)
    lines[0] += " vram_used=24000"
    lines[3] += " vram_used=1024"
    return [*lines, proc_line(0, 4242, vram=23000 * MIB), proc_line(3, 4343, vram=MIB)], names


HELD = {"p0": xcp_name(0, 0), "p3": xcp_name(0, 3)}


def test_partitions_reporting_their_own_vram_give_each_pod_its_own_share(
        rocm: Path, tmp_path: Path) -> None:
    lines, names = cpx("own")
    snap, got, _ = pods(rocm, tmp_path, lines, names, HELD)
    assert got["p0"]["gpu-memory"] == pytest.approx(100 * 24000 / PART)  # 97.7
    assert got["p0"]["gpu-memory-used"] == 24000.0
    assert got["p3"]["gpu-memory"] == pytest.approx(100 * 1024 / PART)
    (g,) = snap["gpus"]
    assert g["memory_total_bytes"] == 8 * PART * MIB  # the partitions' sum: the GPU
    assert g["memory_used_bytes"] == (24000 + 1024 + 6 * 284) * MIB


@pytest.mark.parametrize(("report", "memory", "pool"), [
    ("gpu", "NPS1", "the whole GPU's"),  # ROCm 6.3.3: every handle the whole pool
    ("gpu", "NPS4", "the whole GPU's"),  # ... in NPS4 too (ROCm issue 4750)
    ("pool", "NPS4", "its NPS4 memory partition's"),  # each its memory partition's pool
])
def test_partitions_reporting_a_pool_make_the_pods_memory_unavailable_with_why(
        rocm: Path, tmp_path: Path, report: str, memory: str, pool: str) -> None:
    """Read as it is given, the pod filling its partition would read 12.2 % (its 24000 MiB
    over the pool's 196592) instead of 97.7 %: its memory is UNAVAILABLE instead, and the
    reason names the ROCm release and what to do. The GPU's own total stays the GPU's."""
    lines, names = cpx(report, memory)
    snap, got, _ = pods(rocm, tmp_path, lines, names, HELD)
    for pod in ("p0", "p3"):
        assert got[pod]["gpu-memory"] == "unavailable"
        assert got[pod]["gpu-memory-used"] == "unavailable"
        why = got[pod]["reasons"]["gpu-memory"]
        assert f"reports {pool} VRAM" in why
        assert "ROCm 7.0.2" in why
        assert "ROCm issue 4750" in why
        assert "upgrade ROCm" in why
        assert len(why) <= 200  # what the stream carries of a reason
    assert got["p0"]["gpu-utilization"] == 95.0  # the rest of the partition is read
    (g,) = snap["gpus"]
    assert g["memory_total_bytes"] == 196592 * MIB  # once, not 8 times the pool
    assert all(m["memory_used_bytes"] == "unavailable" for m in g["migs"])
    assert any("ROCm issue 4750" in p for p in snap["problems"])


def test_a_partitioned_product_not_known_is_unavailable_never_guessed(
        rocm: Path, tmp_path: Path) -> None:
    lines, names = cpx("own", name="AMD Instinct MI999X")
    _, got, _ = pods(rocm, tmp_path, lines, names, HELD)
    assert got["p0"]["gpu-memory"] == "unavailable"
    assert "does not know this product's memory" in got["p0"]["reasons"]["gpu-memory"]


@pytest.mark.parametrize(("raw", "want"), [
    ({"power_limit": 750}, 750.0),  # the hwmon cap, 750000000 uW
    ({"power_limit": 1000}, 1000.0),  # MI325X: 1000000000 uW (ROCm/amdsmi#174)
    ({"power_limit_uw": 750}, "unavailable"),  # a stack giving watts: 0.00075 W is no cap
])
def test_the_power_cap_is_read_in_microwatts(rocm: Path, tmp_path: Path,
                                            raw: dict[str, int], want: float | str) -> None:
    snap, _, _ = pods(rocm, tmp_path, [gpu_line(0, **raw)], {}, {})
    assert snap["gpus"][0]["power_limit_watts"] == want


def test_vram_used_zero_after_a_failed_read_is_never_taken_as_zero(
        rocm: Path, tmp_path: Path) -> None:
    """rocm_smi answers success with used 0 when its read fails: a whole GPU is never at 0
    (the kernel's own allocations); a partition's 0 is kept only when nothing is listed
    on it and it is idle."""
    lines, names = partitioned_gpu(1, partitions=2, compute="DPX", memory="NPS2",
                                   busy=(50, 0), used_read_fails=1, vram_used=4096)
    snap, got, _ = pods(rocm, tmp_path, [
        gpu_line(0, gfx=60, vram_used=30000, used_read_fails=1), *lines,
        proc_line(0, 4242, vram=29000 * MIB), proc_line(1, 4343, vram=4000 * MIB)],
        names,
        {"p0": "0000:05:00.0", "p1": xcp_name(1, 0, 2), "p2": xcp_name(1, 1, 2)})
    assert got["p0"]["gpu-memory"] == "unavailable"
    assert "VRAM used reads 0" in got["p0"]["reasons"]["gpu-memory"]
    assert got["p1"]["gpu-memory"] == "unavailable"  # its process holds memory
    assert "1 process(es)" in got["p1"]["reasons"]["gpu-memory"]
    assert got["p2"]["gpu-memory"] == 0.0  # idle, nothing listed: a true 0 can be
    g0 = snap["gpus"][0]
    assert (g0["memory_used_bytes"], g0["memory_total_bytes"]) == (
        "unavailable", 196592 * MIB)


def test_partitions_sharing_one_uuid_stay_apart(rocm: Path, tmp_path: Path) -> None:
    # Before ROCm 7.12 every partition answers the GPU's UUID: keyed by it alone, eight
    # partitions would be one device (and one pod would get another's numbers).
    # Partition 3 is then lost: its pod has no number, and no other pod gets its
    # numbers or loses its own.
    lines, names = partitioned_gpu(0, shared_uuid=True, busy=(90, 10, 0, 0, 0, 0, 0, 40))
    later = [line.replace("partition=3 ", "partition=3 lost=1 ") for line in lines]
    snap, got, err = pods(rocm, tmp_path, lines, names,
                          {"p0": xcp_name(0, 0), "p3": xcp_name(0, 3), "p7": xcp_name(0, 7)},
                          later)
    assert not isinstance(got["p3"]["gpu-utilization"], float)
    g = snap["gpus"][0]  # (the lost partition is a GPU of its own: no name, no pod)
    assert len({m["uuid"] for m in g["migs"]} | {g["uuid"]}) == 8
    assert [m["device_id"] for m in g["migs"]] == [xcp_name(0, p) for p in range(8)
                                                    if p != 3]
    assert (got["p0"]["gpu-utilization"], got["p7"]["gpu-utilization"]) == (90.0, 40.0)
    assert "share UUID" in err
    assert "partition ID" in err


def test_a_library_missing_a_symbol_is_named_as_such(tmp_path: Path) -> None:
    old = build(missing=("amdsmi_get_gpu_pm_metrics_info",))
    config = tmp_path / "node.txt"
    config.write_text(gpu_line(0) + "\n")
    got = subprocess.run([sys.executable, "-m", "gpuscale.cli", "gpus", "--gpu-backend",
                          "amd", "--attribution", "off", "--json"],
                         capture_output=True, text=True, timeout=60, check=False,
                         env=env(old, config, FAKEAMDSMI_LIB_VERSION="25.1.0"))
    assert got.returncode == 1
    why = json.loads(got.stdout)["reason"]
    assert "not found" not in why
    assert "lacks amdsmi_get_gpu_pm_metrics_info" in why
    assert "libamd_smi 25.1.0" in why
    assert "ROCm 7.0.2" in why
    assert str(old / "lib" / "libamd_smi.so") in why


REPARTITION = """
import json, sys
from pathlib import Path
from gpuscale.telemetry.amdsmi_backend import AmdSmiBackend
b = AmdSmiBackend("n", sys_root=Path(sys.argv[3]))
out = []
for config in sys.argv[1:3]:
    Path(sys.argv[4]).write_text(Path(config).read_text())
    snap = b.sample()
    out.append([[g.pci_bus_id, g.mig_enabled, [(m.profile, m.device_id,
                 str(m.utilization_percent)) for m in g.migs], str(g.state.value)]
                for g in snap.gpus] + [list(snap.problems)])
print(json.dumps(out))
"""


@pytest.mark.parametrize(("before", "after"), [("SPX", "CPX"), ("CPX", "SPX"),
                                               ("CPX", "DPX")])
def test_a_repartition_is_read_without_a_restart(rocm: Path, tmp_path: Path,
                                                 before: str, after: str) -> None:
    """The library's enumeration is fixed at init: after a repartition its old handles
    answer the new mode (or "not found" for partitions gone) and the new partitions are not
    listed. The backend sees the mode change and enumerates again in the same tick."""
    count = {"SPX": 1, "DPX": 2, "CPX": 8}
    layouts, names = [], {}
    for mode in (before, after):
        if mode == "SPX":
            layouts.append([gpu_line(0, gfx=33, socket=0, render=128)])
            names[128] = xcp_name(0, 0)
            continue
        lines, n = partitioned_gpu(0, partitions=count[mode], compute=mode,
                                   busy=(70,) * count[mode])
        layouts.append(lines)
        names.update(n)
    files = []
    for i, lines in enumerate(layouts):
        files.append(tmp_path / f"layout{i}.txt")
        files[-1].write_text("\n".join(lines) + "\n")
    config = tmp_path / "node.txt"
    got = subprocess.run([sys.executable, "-c", REPARTITION, str(files[0]), str(files[1]),
                          str(drm_tree(tmp_path / "sys", names)), str(config)],
                         capture_output=True, text=True, timeout=60, check=False,
                         env=env(rocm, config))
    assert got.returncode == 0, got.stderr
    first, second = json.loads(got.stdout)
    for snap, mode in ((first, before), (second, after)):
        (g,), problems = snap[:-1], snap[-1]
        assert g[3] == "ok"
        assert problems == []
        if mode == "SPX":
            assert (g[1], g[2]) == (False, [])
            continue
        assert len(g[2]) == count[mode]
        assert [m[0] for m in g[2]] == [f"{mode.lower()}.nps1"] * count[mode]
        assert [m[1] for m in g[2]] == [xcp_name(0, p, count[mode])
                                        for p in range(count[mode])]
        assert {m[2] for m in g[2]} == {"70.0"}
    assert "enumerated again" in got.stderr
