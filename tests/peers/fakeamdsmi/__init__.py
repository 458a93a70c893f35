"""Test double for AMD SMI: build the fake libamd_smi.so and load the real ``amdsmi``.

``build`` compiles ``fakeamdsmi.c`` (the calls gpuscale makes, with amdsmi 7.0.2's
structures) and a generated ``stubs.c``: every other function the installed ``amdsmi``
package binds at import (read from its ``amdsmi_wrapper.py``, which is generated from
``amdsmi.h``), each answering AMDSMI_STATUS_NOT_SUPPORTED, so the package imports as it
does against the real library. Cached per source, symbol list and compiler. The package
finds the library as it would on a node: ``$ROCM_PATH/lib/libamd_smi.so`` (``env``).

The node is a text file (``FAKEAMDSMI_CONFIG``) of ``gpu`` and ``proc`` lines; see
``fakeamdsmi.c`` for the keys and the quirks it reproduces.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
SOURCE = HERE / "fakeamdsmi.c"


def _wrapper() -> Path:
    spec = importlib.util.find_spec("amdsmi")  # found, not imported: it loads the library
    assert spec is not None, "amdsmi is not installed"
    assert spec.submodule_search_locations, "amdsmi is not a package"
    return Path(next(iter(spec.submodule_search_locations))) / "amdsmi_wrapper.py"


def symbols() -> list[str]:
    """Every library function the installed package binds at import."""
    text = _wrapper().read_text()
    return sorted(set(re.findall(r"_libraries\['libamd_smi\.so'\]\.(amdsmi_\w+)", text)))


def build(cache_dir: Path | None = None) -> Path:
    """Compile the fake; return a ROCm root holding ``lib/libamd_smi.so``."""
    source = SOURCE.read_text()
    defined = set(re.findall(r"^int (amdsmi_\w+)\(", source, re.MULTILINE))
    stubs = "".join(f"int {name}(void) {{ return 2; }}\n"  # AMDSMI_STATUS_NOT_SUPPORTED
                    for name in symbols() if name not in defined)
    stubs = stubs.replace("int amdsmi_free_name_value_pairs(void) { return 2; }\n",
                          "void amdsmi_free_name_value_pairs(void *p) { (void)p; }\n")
    digest = hashlib.sha256((source + stubs).encode()).hexdigest()[:16]
    root = (cache_dir or Path(tempfile.gettempdir()) / "gpuscale-fakeamdsmi") / digest
    lib = root / "lib" / "libamd_smi.so"
    if lib.exists():
        return root
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("no C compiler (cc or gcc) on PATH: the AMD tests need one")
    lib.parent.mkdir(parents=True, exist_ok=True)
    stub_file = root / "stubs.c"
    stub_file.write_text(stubs)
    tmp = lib.with_name(f"libamd_smi.so.{os.getpid()}")
    subprocess.run([cc, "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC",
                    "-o", str(tmp), str(SOURCE), str(stub_file)],
                   check=True, capture_output=True, text=True)
    tmp.replace(lib)
    return root


def gpu_line(idx: int, **kw: Any) -> str:
    fields = {"uuid": f"{idx:08x}-0000-1000-8000-74a1aaaaaaaa",
              "bdf": f"0000:{0x05 + idx:02x}:00.0", "name": "AMD Instinct MI300X",
              "serial": f"{0x3E4A1B2C00 + idx:016X}", **kw}
    return "gpu idx=" + str(idx) + " " + " ".join(
        f'{k}="{v}"' if " " in str(v) else f"{k}={v}" for k, v in fields.items())


def proc_line(gpu: int, pid: int, **kw: Any) -> str:
    return f"proc gpu={gpu} pid={pid} " + " ".join(f"{k}={v}" for k, v in kw.items())


def env(root: Path, config: Path, **extra: str) -> dict[str, str]:
    """The environment a process needs to load the fake through the real package."""
    return {**os.environ, "ROCM_PATH": str(root), "FAKEAMDSMI_CONFIG": str(config),
            **extra}
