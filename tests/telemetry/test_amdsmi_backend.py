"""The AMD backend through the real ``amdsmi`` package, loaded against the fake
libamd_smi.so (tests/peers/fakeamdsmi), as ``gpuscale gpus --gpu-backend amd`` runs it."""

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


@pytest.fixture(scope="module")
def rocm() -> Path:
    return build()


def gpus(rocm: Path, tmp_path: Path, lines: list[str], sys_root: Path | None = None,
         **extra: str) -> tuple[int, Any, str]:
    config = tmp_path / "node.txt"
    config.write_text("\n".join(lines) + "\n")
    got = subprocess.run([sys.executable, "-m", "gpuscale.cli", "gpus", "--gpu-backend",
                          "amd", "--attribution", "off", "--json",
                          "--sys-root", str(sys_root or tmp_path / "no-sysfs")],
                         capture_output=True, text=True, timeout=60, check=False,
                         env=env(rocm, config, **extra))
    return got.returncode, json.loads(got.stdout), got.stderr


def test_mi300x_readings_as_the_agent_takes_them(rocm: Path, tmp_path: Path) -> None:
    code, snap, err = gpus(rocm, tmp_path, [
        gpu_line(0, vram_used=51200, gfx=37, umc=12, power=410, power_limit=750, temp=55),
        gpu_line(1, vram_used=1024, gfx=0),
        proc_line(0, 4242, name="python3", vram=8 * 1024 * MIB),
        proc_line(0, 4243, name="python3", vram=MIB, hidden=1)])  # not ours to see
    assert code == 0, err
    assert (snap["backend"], snap["state"]) == ("amdsmi", "ok")
    g0, g1 = snap["gpus"]
    assert g0["uuid"] == "00000000-0000-1000-8000-74a1aaaaaaaa"
    assert g0["pci_bus_id"] == "0000:05:00.0"
    assert g0["name"] == "AMD Instinct MI300X"
    assert (g0["utilization_percent"], g0["memory_util_percent"]) == (37.0, 12.0)
    assert g0["memory_used_bytes"] == 51200 * MIB
    assert g0["memory_total_bytes"] == 196592 * MIB
    assert g0["memory_free_bytes"] == (196592 - 51200) * MIB
    assert (g0["power_watts"], g0["power_limit_watts"], g0["temperature_c"]) == (
        410.0, 750.0, 55.0)
    assert [(p["pid"], p["used_memory_bytes"], p["sm_util_percent"])
            for p in g0["processes"]] == [(4242, 8 * 1024 * MIB, "unsupported")]
    assert g0["processes_unknown"] == "unsupported"  # a process may be missing from it
    assert (g1["utilization_percent"], g1["processes"]) == (0.0, [])  # a true 0: idle


def test_a_lost_gpu_and_unsupported_calls_are_never_numbers(rocm: Path,
                                                           tmp_path: Path) -> None:
    code, snap, err = gpus(rocm, tmp_path, [
        gpu_line(0, gfx=20, unsupported="power,temp,process"),
        gpu_line(1, lost=1, gfx=99)])
    assert code == 0, err
    g0, g1 = snap["gpus"]
    assert (g0["power_watts"], g0["temperature_c"]) == ("unsupported", "unsupported")
    assert g0["processes_unknown"] == "unsupported"  # not "no processes"
    assert g0["utilization_percent"] == 20.0
    assert g1["state"] == "lost"
    assert {g1[k] for k in ("utilization_percent", "memory_used_bytes", "power_watts",
                            "processes_unknown")} == {"lost"}


@pytest.mark.parametrize(("extra", "why"), [
    ({"FAKEAMDSMI_DRIVER": "absent"}, "the amdgpu driver is not loaded"),
    ({"ROCM_PATH": "/nonexistent-rocm"}, "libamd_smi.so not found"),
])
def test_no_usable_library_is_unavailable_with_the_reason(
        rocm: Path, tmp_path: Path, extra: dict[str, str], why: str) -> None:
    code, snap, _ = gpus(rocm, tmp_path, [gpu_line(0)], None, **extra)  # stdout: JSON only
    assert code == 1
    assert snap["state"] == "unavailable"
    assert why in snap["reason"]
    assert snap["gpus"] == []


TWO_SAMPLES = """
import json, sys
from pathlib import Path
from gpuscale.cli.gpus import snapshot_to_json
from gpuscale.telemetry.amdsmi_backend import AmdSmiBackend
b = AmdSmiBackend("n")
first = snapshot_to_json(b.sample())
Path(sys.argv[1]).write_text(Path(sys.argv[2]).read_text())  # the node changes
second = snapshot_to_json(b.sample())
print(json.dumps([first, second]))
"""


def test_what_the_library_cannot_say_never_becomes_a_number(rocm: Path,
                                                            tmp_path: Path) -> None:
    """A process name that is not UTF-8 (the package decodes it strictly) costs that
    reading, not the tick; a GPU whose identity cannot be read is UNAVAILABLE as a whole;
    VRAM is exact bytes; a call that worked and now says "not supported" is unavailable
    (a vanishing sysfs file), not unsupported."""
    config, later = tmp_path / "node.txt", tmp_path / "later.txt"
    config.write_bytes(("\n".join([
        gpu_line(0, gfx=30, vram_used_bytes=51200 * MIB + 12345),
        gpu_line(1, unsupported="uuid")]) + "\n").encode()
        + proc_line(0, 77, vram=MIB).encode() + b" name=py\xc3\n")
    later.write_text(gpu_line(0, gfx=30, unsupported="activity") + "\n"
                     + gpu_line(1, unsupported="uuid") + "\n")
    got = subprocess.run([sys.executable, "-c", TWO_SAMPLES, str(config), str(later)],
                         capture_output=True, text=True, timeout=60, check=False,
                         env=env(rocm, config))
    assert got.returncode == 0, got.stderr
    first, second = json.loads(got.stdout)
    g0, g1 = first["gpus"]
    assert first["state"] == "ok"
    assert g0["memory_used_bytes"] == 51200 * MIB + 12345  # not rounded down to MiB
    assert g0["processes_unknown"] == "unavailable"  # the list could not be decoded
    assert any("gpu 0: processes: unavailable" in p for p in first["problems"])
    assert (g1["state"], g1["uuid"], g1["utilization_percent"]) == (
        "unavailable", "", "unavailable")
    assert second["gpus"][0]["utilization_percent"] == "unavailable"


def test_cpx_partitions_are_read_as_partitions_of_one_gpu(rocm: Path, tmp_path: Path) -> None:
    """Two MI300X in CPX mode: each is one GPU of 8 partitions. A partition's utilization
    is its own XCC's busy share (95), never the GPU's average (12); power and temperature
    are the socket's; each partition carries the device plugin's name for it. The second
    GPU's KFD puts the partition ID in the BDF's function (an older driver)."""
    lines0, names0 = partitioned_gpu(0, gfx=12, busy=(95, 0, 3), vram_used=4096, power=420,
                                     temp=61)
    lines1, names1 = partitioned_gpu(1, gfx=50, busy=(50,) * 8,
                                     bdf_function_is_partition=True)
    sysfs = drm_tree(tmp_path / "sys", {**names0, **names1})
    code, snap, err = gpus(rocm, tmp_path, [*lines0, *lines1,
                                            proc_line(0, 4242, vram=3 * 2**30),
                                            proc_line(9, 4343, vram=2**30)], sys_root=sysfs)
    assert code == 0, err
    assert [g["pci_bus_id"] for g in snap["gpus"]] == ["0000:05:00.0", "0000:06:00.0"]
    g0, g1 = snap["gpus"]
    assert (g0["mig_enabled"], g0["sharing"], len(g0["migs"])) == (True, "mig", 8)
    assert g0["utilization_percent"] == 12.0  # the GPU's average over its partitions
    assert (g0["power_watts"], g0["temperature_c"]) == (420.0, 61.0)
    parts = g0["migs"]
    assert [m["utilization_percent"] for m in parts[:4]] == [95.0, 0.0, 3.0, "unsupported"]
    assert [m["gpu_instance_id"] for m in parts] == list(range(8))
    assert [m["profile"] for m in parts] == ["cpx.nps1"] * 8
    assert [m["device_id"] for m in parts] == [xcp_name(0, p) for p in range(8)]
    assert parts[0]["memory_used_bytes"] == 4096 * MIB
    assert parts[0]["memory_total_bytes"] == 196592 // 8 * MIB
    # The GPU's: the sums over its partitions (each partition's share of it stays right).
    assert g0["memory_total_bytes"] == 8 * (196592 // 8) * MIB
    assert g0["memory_used_bytes"] == 8 * 4096 * MIB
    assert [p["pid"] for p in parts[0]["processes"]] == [4242]
    assert [p["pid"] for p in g1["migs"][1]["processes"]] == [4343]
    assert [p["pid"] for p in g0["processes"]] == [4242]  # the GPU: all its partitions'
    assert len({m["uuid"] for g in (g0, g1) for m in g["migs"]} | {g0["uuid"]}) == 17
    assert [m["device_id"] for m in g1["migs"]] == [xcp_name(1, p) for p in range(8)]
    assert snap["problems"] == []
    table = subprocess.run([sys.executable, "-m", "gpuscale.cli", "gpus", "--gpu-backend",
                            "amd", "--attribution", "off", "--sys-root", str(sysfs)],
                           capture_output=True, text=True, timeout=60, check=True,
                           env=env(rocm, tmp_path / "node.txt")).stdout
    assert "cpx.nps1" in table
    assert "amdgpu_xcp_2" in table  # each partition with the device plugin's name


def test_partitions_whose_names_cannot_be_read_say_why(rocm: Path, tmp_path: Path) -> None:
    # No host /sys: which device-plugin device each partition is cannot be known, so no
    # pod will be matched to them (their pods read unknown) - and the reason says so.
    lines, _ = partitioned_gpu(0, partitions=2, compute="DPX", memory="NPS2",
                               busy=(40, 10))
    code, snap, err = gpus(rocm, tmp_path, lines)
    assert code == 0, err
    (g,) = snap["gpus"]
    assert [m["device_id"] for m in g["migs"]] == ["", ""]
    assert [m["profile"] for m in g["migs"]] == ["dpx.nps2"] * 2
    assert any("mount the host's /sys" in p for p in snap["problems"])


@pytest.mark.parametrize("unsupported", ["metrics", "kfd"])
def test_a_partition_without_its_own_busy_share_never_reads_the_gpus(
        rocm: Path, tmp_path: Path, unsupported: str) -> None:
    # The metrics table not supported, or the partition ID not readable: the partition's
    # utilization is unknown - the GPU's average (12) would be smaller than a busy one's.
    lines, names = partitioned_gpu(0, partitions=4, compute="QPX", gfx=12,
                                   busy=(90, 0, 0, 0), unsupported=unsupported)
    code, snap, err = gpus(rocm, tmp_path, lines, sys_root=drm_tree(tmp_path / "s", names))
    assert code == 0, err
    (g,) = snap["gpus"]
    assert all(m["utilization_percent"] == "unsupported" for m in g["migs"]), g["migs"]


@pytest.mark.parametrize("rocm_version", ["7.1.0", "6.4.3"])
def test_another_rocm_release_is_refused_with_what_to_install(
        rocm: Path, tmp_path: Path, rocm_version: str) -> None:
    # The package's structure layouts are its ROCm's: read through them, another release's
    # library could give wrong numbers. Nothing is read; the reason says what to install.
    code, snap, _ = gpus(rocm, tmp_path, [gpu_line(0, gfx=40)], None,
                         FAKEAMDSMI_ROCM_VERSION=rocm_version)
    assert code == 1
    assert snap["state"] == "unavailable"
    assert f"ROCm {rocm_version} on this node, but the amdsmi package is 7.0.2" in snap["reason"]
    assert f"amdsmi=={rocm_version[:3]}.*" in snap["reason"]


def test_a_patch_release_or_an_unreadable_version_is_read(rocm: Path, tmp_path: Path) -> None:
    for version in ("7.0.0", "fail"):
        code, snap, err = gpus(rocm, tmp_path, [gpu_line(0, gfx=40)], None,
                               FAKEAMDSMI_ROCM_VERSION=version)
        assert code == 0, err
        assert snap["gpus"][0]["utilization_percent"] == 40.0
        assert ("cannot check this node's ROCm version" in err) == (version == "fail")


def test_a_process_entry_without_a_pid_makes_the_list_unavailable(rocm: Path,
                                                                  tmp_path: Path) -> None:
    # Whose process it is cannot be said: the list is unavailable, never a list without it.
    code, snap, err = gpus(rocm, tmp_path, [gpu_line(0, gfx=30), proc_line(0, 0, vram=MIB),
                                            proc_line(0, 4242, vram=MIB)])
    assert code == 0, err
    (g,) = snap["gpus"]
    assert (g["processes"], g["processes_unknown"]) == ([], "unavailable")
    assert g["utilization_percent"] == 30.0



BUSY_OVER_TIME = """
import json, sys, time
from gpuscale.telemetry.amdsmi_backend import AmdSmiBackend
b = AmdSmiBackend("n", sys_root=__import__("pathlib").Path(sys.argv[1]))
shares = []
for _ in range(2):
    snap = b.sample()
    shares.append([m.utilization_percent for m in snap.gpus[0].migs])
    time.sleep(0.05)
print(json.dumps(shares))
"""


def test_a_partition_caught_at_a_quiet_moment_reads_its_average(rocm: Path,
                                                                 tmp_path: Path) -> None:
    # Partition 0's instantaneous share is 10 while it averaged 60 since the last tick:
    # from the second tick on it reads 60 (never the smaller); partition 1's average (20)
    # is below its instantaneous 50: it keeps 50.
    lines, names = partitioned_gpu(0, partitions=2, compute="DPX", busy=(10, 50))
    lines[0] = lines[0] + " busy_avg=60"
    lines[1] = lines[1] + " busy_avg=20"
    config = tmp_path / "node.txt"
    config.write_text("\n".join(lines) + "\n")
    sysfs = drm_tree(tmp_path / "sys", names)
    got = subprocess.run([sys.executable, "-c", BUSY_OVER_TIME, str(sysfs)],
                         capture_output=True, text=True, timeout=60, check=True,
                         env=env(rocm, config))
    first, second = json.loads(got.stdout)
    assert first == [10.0, 50.0]
    assert second[0] == pytest.approx(60.0, abs=3.0)
    assert second[1] == 50.0


def test_repeated_partition_ids_leave_every_partitions_share_unknown(rocm: Path,
                                                                     tmp_path: Path) -> None:
    # Two partitions both say they are partition 0: whose row of the metrics table is
    # whose cannot be said, so neither gets one (and they stay two devices).
    lines, names = partitioned_gpu(0, partitions=2, compute="DPX", busy=(90, 5))
    lines[1] = lines[1].replace("partition=1", "partition=0")
    code, snap, err = gpus(rocm, tmp_path, lines, sys_root=drm_tree(tmp_path / "s", names))
    assert code == 0, err
    (g,) = snap["gpus"]
    assert [m["utilization_percent"] for m in g["migs"]] == ["unsupported"] * 2
    assert len({m["uuid"] for m in g["migs"]}) == 2
    assert any("partition IDs unreadable or repeated" in p for p in snap["problems"])


IDENTITY_CHANGES = """
import json, sys
from pathlib import Path
from gpuscale.telemetry.amdsmi_backend import AmdSmiBackend
b = AmdSmiBackend("n")
first = b.sample().gpus[0]
Path(sys.argv[1]).write_text(Path(sys.argv[2]).read_text())  # another GPU in its place
second = b.sample().gpus[0]
print(json.dumps([[g.uuid, g.state.value, str(g.utilization_percent)] for g in (first, second)]))
"""


def test_a_gpu_whose_identity_is_half_read_is_never_taken_for_the_last_one(
        rocm: Path, tmp_path: Path) -> None:
    # The GPU at this place now has another UUID and no readable PCI address: it is not
    # the one seen there before (whose pods would get its readings) - unknown instead.
    before, after = tmp_path / "node.txt", tmp_path / "after.txt"
    before.write_text(gpu_line(0, gfx=10) + "\n")
    after.write_text(gpu_line(0, uuid="ffffffff-0000-1000-8000-74a1aaaaaaaa", gfx=90,
                              unsupported="bdf") + "\n")
    got = subprocess.run([sys.executable, "-c", IDENTITY_CHANGES, str(before), str(after)],
                         capture_output=True, text=True, timeout=60, check=True,
                         env=env(rocm, before))
    first, second = json.loads(got.stdout)
    assert first == ["00000000-0000-1000-8000-74a1aaaaaaaa", "ok", "10.0"]
    assert second[:2] == ["", "unavailable"]
