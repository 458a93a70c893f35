"""Test double for AMD SMI: build the fake libamd_smi.so and load the real ``amdsmi``.

``build`` compiles ``fakeamdsmi.c`` (the calls gpuscale makes, with amdsmi 7.0.2's
structures) and a generated ``stubs.c``: every other function the installed ``amdsmi``
package binds at import (read from its ``amdsmi_wrapper.py``, which is generated from
``amdsmi.h``), each answering AMDSMI_STATUS_NOT_SUPPORTED, so the package imports as it
does against the real library. The GPU metrics table (``amdsmi_gpu_metrics_t``, 77 packed
fields) is declared in C from that same file (``gpu_metrics.h``, generated), so its layout
is the installed package's, not a copy. Cached per source, symbol list and compiler. The package
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
ROCM_CORE = HERE / "rocmcore.c"  # librocm-core.so: the ROCm version the package checks


def _wrapper() -> Path:
    spec = importlib.util.find_spec("amdsmi")  # found, not imported: it loads the library
    assert spec is not None, "amdsmi is not installed"
    assert spec.submodule_search_locations, "amdsmi is not a package"
    return Path(next(iter(spec.submodule_search_locations))) / "amdsmi_wrapper.py"


def symbols() -> list[str]:
    """Every library function the installed package binds at import."""
    text = _wrapper().read_text()
    return sorted(set(re.findall(r"_libraries\['libamd_smi\.so'\]\.(amdsmi_\w+)", text)))


_CTYPES = {"c_ubyte": "uint8_t", "c_uint8": "uint8_t", "c_uint16": "uint16_t",
           "c_uint32": "uint32_t", "c_uint64": "uint64_t", "c_int32": "int32_t",
           "c_int64": "int64_t", "c_char": "char"}
_METRICS = ("struct_amd_metrics_table_header_t", "struct_amdsmi_gpu_xcp_metrics_t",
            "struct_amdsmi_gpu_metrics_t")


def metrics_header() -> str:
    """C declarations of the GPU metrics table, translated from the package's ctypes
    structures (each packed to 1 byte, as the package declares them)."""
    text = _wrapper().read_text()
    out = ["#pragma pack(push, 1)"]
    for struct in _METRICS:
        m = re.search(rf"^{struct}\._fields_ = \[\n(.*?)^\]", text, re.MULTILINE | re.DOTALL)
        assert m, f"{struct} not in the installed amdsmi_wrapper.py"
        out.append("typedef struct {")
        for name, typ, count in re.findall(
                r"\('(\w+)', (?:ctypes\.)?(\w+)(?: \* (\d+))?\)", m.group(1)):
            c = _CTYPES.get(typ) or {"amd_metrics_table_header_t":
                                     "struct_amd_metrics_table_header_t"}.get(typ, typ)
            out.append(f"    {c} {name}{f'[{count}]' if count else ''};")
        out.append(f"}} {struct};")
    out.append("#pragma pack(pop)")
    return "\n".join(out) + "\n"


def build(cache_dir: Path | None = None, missing: tuple[str, ...] = ()) -> Path:
    """Compile the fake; return a ROCm root holding ``lib/libamd_smi.so``. ``missing``:
    functions the package binds that this library lacks (an older library than the
    package: the package's import fails on the first one)."""
    source = SOURCE.read_text()
    defined = set(re.findall(r"^int (amdsmi_\w+)\(", source, re.MULTILINE))
    assert not set(missing) & defined, "only functions the fake stubs can be left out"
    stubs = "".join(f"int {name}(void) {{ return 2; }}\n"  # AMDSMI_STATUS_NOT_SUPPORTED
                    for name in symbols() if name not in defined and name not in missing)
    stubs = stubs.replace("int amdsmi_free_name_value_pairs(void) { return 2; }\n",
                          "void amdsmi_free_name_value_pairs(void *p) { (void)p; }\n")
    header = metrics_header()
    core = ROCM_CORE.read_text()
    digest = hashlib.sha256((source + stubs + header + core).encode()).hexdigest()[:16]
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
    (root / "gpu_metrics.h").write_text(header)
    tmp = lib.with_name(f"libamd_smi.so.{os.getpid()}")
    flags = ["-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC"]
    core_lib = lib.with_name("librocm-core.so")
    subprocess.run([cc, *flags, "-o", str(core_lib), str(ROCM_CORE)], check=True,
                   capture_output=True, text=True)
    subprocess.run([cc, *flags, "-I", str(root), "-o", str(tmp), str(SOURCE), str(stub_file)],
                   check=True, capture_output=True, text=True)
    tmp.replace(lib)  # last: its presence says the build is whole
    return root


def gpu_line(idx: int, **kw: Any) -> str:
    fields = {"uuid": f"{idx:08x}-0000-1000-8000-74a1aaaaaaaa",
              "bdf": f"0000:{0x05 + idx:02x}:00.0", "name": "AMD Instinct MI300X",
              "serial": f"{0x3E4A1B2C00 + idx:016X}", **kw}
    return "gpu idx=" + str(idx) + " " + " ".join(
        f'{k}="{v}"' if " " in str(v) else f"{k}={v}" for k, v in fields.items())


def xcp_name(gpu: int, partition: int, partitions: int = 8) -> str:
    """The AMD device plugin's name for a partition: its GPU's PCI address for the first,
    ``amdgpu_xcp_<n>`` (numbered across the node) for the others."""
    if partition == 0:
        return f"0000:{0x05 + gpu:02x}:00.0"
    return f"amdgpu_xcp_{gpu * (partitions - 1) + partition - 1}"


def partitioned_gpu(gpu: int, *, partitions: int = 8, compute: str = "CPX",
                    memory: str = "NPS1", busy: tuple[int, ...] = (),
                    bdf_function_is_partition: bool = False, shared_uuid: bool = False,
                    **kw: Any) -> tuple[list[str], dict[int, str]]:
    """One physical GPU in a partition mode: its processors' ``gpu`` lines, and each
    partition's render minor -> device plugin name (for ``tests.support.sysfs``).
    Processor ``gpu * partitions + p`` is partition p; ``busy[p]`` its XCCs' busy share;
    each partition's own VRAM is 1/N of the GPU's (what the library reports for its handle
    is ``vram_report=``: "own", "gpu" or "pool", see fakeamdsmi.c); ``shared_uuid``: every
    partition answers the first one's UUID (ROCm before 7.12);
    power and temperature are the first partition's (the socket's readings): the others
    answer power 0 and no temperature (AMD's device metrics exporter documents both for
    partitions other than 0, docs/configuration/metricslist.md)."""
    lines, names = [], {}
    for p in range(partitions):
        idx = gpu * partitions + p
        fields: dict[str, Any] = {
            "bdf": f"0000:{0x05 + gpu:02x}:00.{p if bdf_function_is_partition else 0}",
            "socket": gpu, "partition": p, "render": 128 + idx, "compute": compute,
            "memory": memory, "vram_total": 196592 // partitions, **kw}
        if p < len(busy):
            fields["busy"] = busy[p]
        if shared_uuid:
            fields["uuid"] = f"{gpu * partitions:08x}-0000-1000-8000-74a1aaaaaaaa"
        if p > 0:
            fields["power"] = 0
            fields["unsupported"] = ",".join(
                x for x in ("temp", str(kw.get("unsupported", ""))) if x)
        lines.append(gpu_line(idx, **fields))
        names[128 + idx] = xcp_name(gpu, p, partitions)
    return lines, names


def proc_line(gpu: int, pid: int, **kw: Any) -> str:
    return f"proc gpu={gpu} pid={pid} " + " ".join(f"{k}={v}" for k, v in kw.items())


def env(root: Path, config: Path, **extra: str) -> dict[str, str]:
    """The environment a process needs to load the fake through the real package."""
    return {**os.environ, "ROCM_PATH": str(root), "FAKEAMDSMI_CONFIG": str(config),
            **extra}
