"""Test double for NVML: build the fake libnvidia-ml.so.1 and drive the real bindings.

``build`` compiles ``fakenvml.c`` with the machine's C compiler (cached per source hash and
flags). ``NvmlProcess`` runs ``drive.py`` in a subprocess whose LD_LIBRARY_PATH is set before
the interpreter starts, so the unmodified nvidia-ml-py bindings load the fake.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
SOURCE = HERE / "fakenvml.c"
DRIVER = HERE / "drive.py"


def build(old_driver: bool = False, cache_dir: Path | None = None) -> Path:
    """Compile the fake; return the directory holding libnvidia-ml.so.1."""
    flags = ["-DFAKENVML_OLD_DRIVER"] if old_driver else []
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(flags).encode()).hexdigest()[:16]
    root = cache_dir or Path(tempfile.gettempdir()) / "gpuscale-fakenvml"
    out = root / digest
    lib = out / "libnvidia-ml.so.1"
    if lib.exists():
        return out
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("no C compiler (cc or gcc) on PATH: the NVML tests need one")
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f"libnvidia-ml.so.1.{os.getpid()}"
    subprocess.run([cc, "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC",
                    "-Wl,-soname,libnvidia-ml.so.1", *flags, "-o", str(tmp), str(SOURCE),
                    "-lpthread"], check=True, capture_output=True, text=True)
    tmp.replace(lib)
    return out


def gpu_line(idx: int, **kw: Any) -> str:
    fields = {"uuid": f"GPU-{idx:08d}-0000-0000-0000-000000000000",
              "name": "NVIDIA H100 80GB HBM3", "pci": f"00000000:{0x18 + idx:02X}:00.0",
              "mem_total": 85520809984, **kw}
    return f"gpu idx={idx} " + " ".join(f'{k}="{v}"' for k, v in fields.items())


def mig_line(gpu: int, idx: int, **kw: Any) -> str:
    fields = {"uuid": f"MIG-{gpu:04d}{idx:04d}-0000-0000-0000-000000000000", **kw}
    return f"mig gpu={gpu} idx={idx} " + " ".join(f"{k}={v}" for k, v in fields.items())


def proc_line(gpu: int, pid: int, **kw: Any) -> str:
    return f"proc gpu={gpu} pid={pid} " + " ".join(f"{k}={v}" for k, v in kw.items())


def big_mig_scenario(gpus: int = 8, migs: int = 7, procs_per_gpu: int = 8) -> str:
    """8 H100s x 7 MIG 1g.10gb instances with GPM, and processes spread over the slices."""
    lines = ["global driver=550.54.15"]
    for g in range(gpus):
        lines.append(gpu_line(g, mig=1, gpm=1, power_mw=350000, nvlink_kib_s=1000))
        for m in range(migs):
            lines.append(mig_line(g, m, gi=m + 7, gslices=1, mem_mb=9984,
                                  mem_used=2**30 * (m + 1), gpm_util=10 * m))
        for p in range(procs_per_gpu):
            lines.append(proc_line(g, 10000 + g * 100 + p, mig=p % migs, mem=2**30))
    return "\n".join(lines) + "\n"


class NvmlProcess:
    """The NVML backend in a subprocess that loaded the fake library; one JSON per sample."""

    def __init__(self, lib_dir: Path | None, scenario: Path, *args: str) -> None:
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = str(lib_dir) if lib_dir else str(scenario.parent / "empty")
        env["FAKENVML_SCENARIO"] = str(scenario)
        env["PYTHONUNBUFFERED"] = "1"
        self.proc = subprocess.Popen([sys.executable, str(DRIVER), *args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env)
        self._stderr: str | None = None

    def sample(self) -> dict[str, Any]:
        return self.ask("sample")

    def ask(self, command: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"driver exited: {self.close()}")
        result: dict[str, Any] = json.loads(line)
        return result

    def close(self) -> str:
        """Stop the driver (idempotent); return what it logged on stderr."""
        if self._stderr is None:
            try:
                _, self._stderr = self.proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                _, self._stderr = self.proc.communicate()
        return self._stderr

    def __enter__(self) -> NvmlProcess:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
