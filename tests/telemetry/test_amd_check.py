"""``gpuscale gpus --gpu-backend amd --compare-amd-smi``: a first run's check on an AMD node,
against the AMD backend on the fake libamd_smi.so and a stand-in amd-smi printing JSON as
the real tool does; its parser of amd-smi's JSON, on anything."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscale.tools.amd_check import AmdSmiOutputError, theirs
from tests.peers import fakeamdsmi
from tests.peers.fakeamdsmi import env, gpu_line, partitioned_gpu
from tests.support.sysfs import drm_tree

FAKE_AMD_SMI = Path(fakeamdsmi.__file__).parent / "amd_smi.py"


def unit(value: float, u: str) -> dict[str, Any]:
    return {"value": value, "unit": u}


def amd_smi_says(processors: list[dict[str, Any]]) -> tuple[list[Any], list[Any]]:
    """amd-smi's list and metric JSON for processors given as {gpu, uuid, bdf, partition,
    gfx, umc, power, hotspot, used, total} (readings absent where not given)."""
    listed = [{"gpu": p["gpu"], "bdf": p["bdf"], "uuid": p["uuid"], "kfd_id": 1000 + p["gpu"],
               "node_id": p["gpu"] + 1, "partition_id": p["partition"]} for p in processors]
    metric = []
    for p in processors:
        m: dict[str, Any] = {"gpu": p["gpu"],
                             "mem_usage": {"total_vram": unit(p["total"], "MB"),
                                           "used_vram": unit(p["used"], "MB"),
                                           "free_vram": unit(p["total"] - p["used"], "MB")}}
        if "gfx" in p:
            m["usage"] = {"gfx_activity": unit(p["gfx"], "%"),
                          "umc_activity": unit(p["umc"], "%"), "mm_activity": "N/A"}
            m["power"] = {"socket_power": unit(p["power"], "W"), "gfx_voltage": "N/A"}
            m["temperature"] = {"edge": "N/A", "hotspot": unit(p["hotspot"], "C")}
        if "xcp" in p:  # the GPU's table: each partition's XCCs (N/A past those it holds)
            m.setdefault("usage", {})["gfx_busy_inst"] = {
                f"xcp_{k}": [*row, *["N/A"] * (8 - len(row))] for k, row in enumerate(p["xcp"])}
        metric.append(m)
    return listed, metric


def compare(tmp_path: Path, lines: list[str], listed: Any, metric: Any,
            names: dict[int, str] | None = None) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "node.txt"
    config.write_text("\n".join(lines) + "\n")
    smi = tmp_path / "amd-smi"
    smi.mkdir(exist_ok=True)
    (smi / "list.json").write_text(json.dumps(listed) if not isinstance(listed, str) else listed)
    (smi / "metric.json").write_text(json.dumps(metric) if not isinstance(metric, str)
                                     else metric)
    tool = tmp_path / "bin" / "amd-smi"
    tool.parent.mkdir(exist_ok=True)
    tool.write_text(f"#!{sys.executable}\n" + FAKE_AMD_SMI.read_text())
    tool.chmod(0o755)
    sys_root = drm_tree(tmp_path / "sys", names or {})
    return subprocess.run(
        [sys.executable, "-m", "gpuscale.cli", "gpus", "--gpu-backend", "amd",
         "--attribution", "off", "--sys-root", str(sys_root), "--compare-amd-smi",
         "--amd-smi", str(tool)],
        capture_output=True, text=True, timeout=60, check=False,
        env=env(fakeamdsmi.build(), config, FAKE_AMD_SMI_DIR=str(smi)))


def node() -> tuple[list[str], dict[int, str], list[dict[str, Any]]]:
    """A whole MI300X, then one in DPX mode (2 partitions: 50 and 10 % busy), and what
    amd-smi says of them (older KFD style: the second partition's BDF function is 1)."""
    lines, names = partitioned_gpu(1, partitions=2, compute="DPX", memory="NPS2", gfx=30,
                                   umc=7, busy=(50, 10), vram_used=2048, power=380, temp=58)
    whole = gpu_line(0, gfx=40, umc=12, vram_used=4096, power=410, temp=55)
    said = [{"gpu": 0, "uuid": "00000000-0000-1000-8000-74a1aaaaaaaa", "bdf": "0000:05:00.0",
             "partition": 0, "gfx": 41, "umc": 12, "power": 412, "hotspot": 55,
             "used": 4100, "total": 196592},
            {"gpu": 1, "uuid": "00000002-0000-1000-8000-74a1aaaaaaaa", "bdf": "0000:06:00.0",
             "partition": 0, "gfx": 30, "umc": 7, "power": 380, "hotspot": 58, "used": 2048,
             "total": 98296, "xcp": [[50] * 4, [10] * 4]},
            {"gpu": 2, "uuid": "00000003-0000-1000-8000-74a1aaaaaaaa", "bdf": "0000:06:00.1",
             "partition": 1, "used": 2048, "total": 98296, "xcp": [[50] * 4, [10] * 4]}]
    return [whole, *lines], names, said


def test_readings_that_agree_with_amd_smi_pass(tmp_path: Path) -> None:
    lines, names, said = node()
    got = compare(tmp_path, lines, *amd_smi_says(said), names=names)
    assert got.returncode == 0, got.stdout + got.stderr
    table = got.stdout.split("\n\n")[0].splitlines()[1:]  # the rows, before the summary
    rows = [line.split() for line in table]
    assert rows, got.stdout
    assert {r[-1] for r in rows} == {"same"}, got.stdout
    # Every processor's identity and each reading amd-smi shows was compared.
    assert {(r[0], r[1]) for r in rows} >= {("0", "gfx_activity"), ("1", "power_w"),
                                             ("2", "partition"), ("2", "vram_used_mib"),
                                             ("1", "partition_busy"), ("2", "partition_busy")}
    assert "0 field(s) differ" in got.stdout


def test_a_reading_that_differs_fails_and_says_which(tmp_path: Path) -> None:
    lines, names, said = node()
    said[0]["gfx"] = 90  # amd-smi sees the GPU busy, gpuscale read 40: a wrong reading
    said[2]["uuid"] = "00000009-0000-1000-8000-74a1aaaaaaaa"
    said[1]["xcp"] = said[2]["xcp"] = [[95] * 4, [10] * 4]  # partition 0 busier than read
    got = compare(tmp_path, lines, *amd_smi_says(said), names=names)
    assert got.returncode == 1
    differs = [line.split() for line in got.stdout.splitlines() if line.endswith("DIFFERS")]
    assert [(d[0], d[1]) for d in differs] == [("0", "gfx_activity"), ("1", "partition_busy"),
                                               ("2", "uuid")]
    assert "Please report them" in got.stdout


def test_amd_smis_wrapped_list_and_missing_fields_are_read_as_such(tmp_path: Path) -> None:
    lines, names, said = node()
    listed, metric = amd_smi_says(said)
    del metric[0]["temperature"]
    got = compare(tmp_path, lines, {"gpu_data": listed}, {"gpu_data": metric}, names)
    assert got.returncode == 0, got.stdout + got.stderr
    assert any(line.split()[:2] == ["0", "hotspot_c"] and line.endswith("not in amd-smi")
               for line in got.stdout.splitlines())


@pytest.mark.parametrize(("listed", "why"), [
    ("not json", "amd-smi list --json is not JSON"),
    ('{"a": [], "b": []}', "is not a list of GPUs"),
    ("[1, 2]", "is not a list of GPUs"),
])
def test_output_that_is_not_amd_smis_json_is_a_clear_error(tmp_path: Path, listed: str,
                                                           why: str) -> None:
    lines, names, said = node()
    got = compare(tmp_path, lines, listed, amd_smi_says(said)[1], names)
    assert got.returncode == 1
    assert why in got.stderr
    assert "Traceback" not in got.stderr


def test_amd_smi_missing_or_failing_is_a_clear_error(tmp_path: Path) -> None:
    lines, names, said = node()
    (tmp_path / "amd-smi").mkdir()
    (tmp_path / "amd-smi" / "exit_code").write_text("1")
    got = compare(tmp_path, lines, *amd_smi_says(said), names=names)
    assert got.returncode == 1
    assert "amd-smi list --json exited 1: amd-smi: error: the GPU driver" in got.stderr
    config = tmp_path / "node.txt"
    none = subprocess.run(
        [sys.executable, "-m", "gpuscale.cli", "gpus", "--gpu-backend", "amd",
         "--attribution", "off", "--compare-amd-smi", "--amd-smi", "no-such-amd-smi"],
        capture_output=True, text=True, timeout=60, check=False,
        env={**env(fakeamdsmi.build(), config), "PATH": os.defpath,
             "ROCM_PATH": str(fakeamdsmi.build())})
    assert none.returncode == 2  # a command line that cannot be used
    assert "'no-such-amd-smi' not found" in none.stderr


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(listed=_json, metric=_json)
def test_any_json_is_read_or_refused_with_amd_smis_error(listed: Any, metric: Any) -> None:
    try:
        got = theirs(json.dumps(listed), json.dumps(metric))
    except AmdSmiOutputError:
        return
    for p in got:
        assert all(isinstance(v, float) for v in p.values.values())
