"""Agent cost on an AMD node: 8 MI300X in CPX mode (each GPU 8 compute partitions, which
the library enumerates as 64 processors under 8 sockets), 2 processes a partition, through
the real ``amdsmi`` package on the fake libamd_smi.so (tests/peers/fakeamdsmi), each
partition named through a sysfs tree as the host lays it out (tests/support/sysfs).

Prints, for BENCHMARKS.md:
  1. one sample: wall and CPU time per AmdSmiBackend.sample(), and library calls per sample
     (the fake answers in well under a microsecond; a real libamd_smi reads sysfs and the
     driver, so the call count is what to scale by on real hardware); beside it, in the same
     run, the same figures for the NVML backend on the fake NVML with 8 whole GPUs - the
     yardstick that makes a rerun on another machine comparable;
  2. the agent process (gpuscale agent --gpu-backend amd, 1 Hz, /metrics scraped every
     15 s): CPU as % of one core, RSS and peak RSS.

Usage: .venv/bin/python bench/bench_amd.py [--duration 60] [--samples 300]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.proc import measure_agent  # noqa: E402
from tests.peers import fakeamdsmi, fakenvml  # noqa: E402
from tests.support.sysfs import drm_tree  # noqa: E402

GPUS, PER_GPU = 8, 8  # 8 MI300X x CPX
PARTITIONS = GPUS * PER_GPU
PROCS_PER_PARTITION = 2

SAMPLE_CODE = textwrap.dedent("""
    import json, statistics, sys, time
    kind, n = sys.argv[1], int(sys.argv[2])
    if kind == "amd":
        from pathlib import Path
        from gpuscale.telemetry.amdsmi_backend import AmdSmiBackend
        b = AmdSmiBackend("bench", sys_root=Path(sys.argv[3]))
    else:
        from gpuscale.telemetry.nvml import NvmlBackend
        b = NvmlBackend(interval=1.0, node="bench")
    first = b.sample()
    assert first.state.value == "ok", first.reason
    walls, cpus = [], []
    for _ in range(n):
        w0, c0 = time.perf_counter(), time.thread_time()
        b.sample()
        walls.append(time.perf_counter() - w0); cpus.append(time.thread_time() - c0)
        time.sleep(0.002)
    calls = [0]
    if kind == "amd":
        import amdsmi.amdsmi_interface as smi
        module, prefix = smi.amdsmi_wrapper, "amdsmi_"
    else:
        import pynvml as module
        prefix = "nvml"
    def counted(fn):
        def wrapper(*a, **k):
            calls[0] += 1
            return fn(*a, **k)
        return wrapper
    for name in dir(module):
        fn = getattr(module, name)
        library = kind != "amd" or hasattr(fn, "argtypes")  # amdsmi: C functions only
        if name.startswith(prefix) and callable(fn) and library:
            setattr(module, name, counted(fn))
    b.sample()
    walls.sort(); cpus.sort()
    assert not first.problems, first.problems
    print(json.dumps({"gpus": sum(max(1, len(g.migs)) for g in first.gpus),
                      "processes": sum(len(g.processes) for g in first.gpus),
                      "median_ms": statistics.median(walls) * 1e3,
                      "p99_ms": walls[int(len(walls) * 0.99) - 1] * 1e3,
                      "cpu_median_ms": statistics.median(cpus) * 1e3, "calls": calls[0]}))
""")


def amd_node(path: Path, sys_root: Path) -> Path:
    """The node's config for the fake library, and its sysfs render nodes under sys_root."""
    lines, names = [], {}
    for g in range(GPUS):
        gpu_lines, gpu_names = fakeamdsmi.partitioned_gpu(
            g, partitions=PER_GPU, name="AMD Instinct MI300X", gfx=40, umc=10, power=700,
            temp=60, vram_used=8192, busy=tuple((g * 8 + p) * 7 % 100 for p in range(8)))
        lines += gpu_lines
        names.update(gpu_names)
    for i in range(PARTITIONS):
        lines += [fakeamdsmi.proc_line(i, 10_000 + i * 10 + k, name="python3",
                                       vram=4 * 2**30) for k in range(PROCS_PER_PARTITION)]
    path.write_text("\n".join(lines) + "\n")
    drm_tree(sys_root, names)
    return path


def one_sample(kind: str, env: dict[str, str], samples: int,
               sys_root: Path) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", SAMPLE_CODE, kind, str(samples),
                          str(sys_root)], env=env,
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        sys.exit(f"{kind} sample benchmark failed:\n{out.stderr}")
    got: dict[str, float] = json.loads(out.stdout)
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=60.0, help="agent measurement, s")
    parser.add_argument("--samples", type=int, default=300, help="samples for part 1")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gpuscale-bench-amd-"))
    sys_root = tmp / "sys"
    amd_env = {**fakeamdsmi.env(fakeamdsmi.build(), amd_node(tmp / "amd.txt", sys_root)),
               "PYTHONUNBUFFERED": "1"}
    nvml_scenario = tmp / "nvml.txt"
    nvml_scenario.write_text("\n".join(fakenvml.gpu_line(i) for i in range(8)) + "\n")
    nvml_env = {**os.environ, "LD_LIBRARY_PATH": str(fakenvml.build()),
                "FAKENVML_SCENARIO": str(nvml_scenario), "FAKENVML_STATIC": "1"}

    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}")
    print(f"fake AMD SMI: {GPUS} MI300X x CPX = {PARTITIONS} processors, "
          f"{PARTITIONS * PROCS_PER_PARTITION} processes\n")
    amd = one_sample("amd", amd_env, args.samples, sys_root)
    nvml = one_sample("nvml", nvml_env, args.samples, sys_root)
    print(f"1. one AMD sample ({args.samples} samples, {amd['gpus']:.0f} processors, "
          f"{amd['processes']:.0f} processes): wall median {amd['median_ms']:.2f} ms, p99 "
          f"{amd['p99_ms']:.2f} ms; CPU median {amd['cpu_median_ms']:.2f} ms; "
          f"{amd['calls']:.0f} library calls per sample")
    print(f"   yardstick, same run: one NVML sample of 8 whole GPUs on the fake NVML: CPU "
          f"median {nvml['cpu_median_ms']:.2f} ms, {nvml['calls']:.0f} calls; AMD / NVML = "
          f"{amd['cpu_median_ms'] / nvml['cpu_median_ms']:.1f}x")

    print("2. " + measure_agent(
        ["--gpu-backend", "amd", "--attribution", "off", "--host", "127.0.0.1", "--port",
         "0", "--interval", "1", "--stream-port", "-1", "--sys-root", str(sys_root)],
        amd_env, args.duration))


if __name__ == "__main__":
    main()
