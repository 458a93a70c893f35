"""The AMD backend through the real ``amdsmi`` package, loaded against the fake
libamd_smi.so (tests/peers/fakeamdsmi), as ``gpuscale gpus --gpu-backend amd`` runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.peers.fakeamdsmi import build, env, gpu_line, proc_line

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def rocm() -> Path:
    return build()


def gpus(rocm: Path, tmp_path: Path, lines: list[str], **extra: str) -> tuple[int, Any, str]:
    config = tmp_path / "node.txt"
    config.write_text("\n".join(lines) + "\n")
    got = subprocess.run([sys.executable, "-m", "gpuscale.cli", "gpus", "--gpu-backend",
                          "amd", "--attribution", "off", "--json"],
                         capture_output=True, text=True, timeout=60, check=False,
                         env=env(rocm, config, **extra))
    return got.returncode, json.loads(got.stdout), got.stderr


def test_mi300x_readings_as_the_agent_takes_them(rocm: Path, tmp_path: Path) -> None:
    code, snap, err = gpus(rocm, tmp_path, [
        gpu_line(0, vram_used=51200, gfx=37, umc=12, power=410, power_limit=750, temp=55),
        gpu_line(1, vram_used=1024, gfx=0),
        proc_line(0, 4242, name="python3", vram=8 * 1024 * MIB),
        proc_line(0, 4243, name="python3", vram=MIB, idle=1)])  # amdgpu lists it not
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
    assert g0["processes_unknown"] == "unsupported"  # amdgpu lists only recent users
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
    code, snap, _ = gpus(rocm, tmp_path, [gpu_line(0)], **extra)  # stdout: JSON only
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
