"""The NVML backend against a real driver: what one sample costs, and which calls cost it.

Needs a machine with an NVIDIA GPU and its driver (libnvidia-ml.so.1); nothing else of the
project's test setup. Prints, for the node as it is (no load is started):

1. each GPU's first reading as the backend returns it (to compare with ``nvidia-smi
   --query-gpu=...``), then the wall and CPU time of ``NvmlBackend.sample()``, median and
   maximum over ``--samples`` samples, without and with PCIe throughput (``--pcie``: two
   ~20 ms blocking calls per GPU, off by default);
2. every NVML entry point one sample calls, with its count and median wall and CPU time
   per call over ``--samples`` samples - where the sample's time goes (pynvml's own
   helpers, e.g. nvmlStructToFriendlyObject, are counted too: they cost what they cost).

``--busy`` first starts a load on GPU 0 (a child process multiplying bf16 matrices with
PyTorch, which is then needed; it is no dependency of the project) and measures while it
runs: the per-process reads have a process to return, and the snapshot's processes are
printed beside ``nvidia-smi --query-compute-apps`` (what the driver shows the node).

Usage: PYTHONPATH=src python3 bench/bench_nvml_real.py [--samples 30] [--busy]
(with the project's .venv: .venv/bin/python bench/bench_nvml_real.py)
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pynvml

from gpuscale.telemetry.nvml import NvmlBackend


def _show(backend: NvmlBackend) -> None:
    snap = backend.sample()
    print(f"snapshot: {snap.state.value} {snap.reason or ''}".rstrip())
    for gpu in snap.gpus:
        fields = dataclasses.asdict(gpu)
        fields["processes"] = len(gpu.processes)
        fields["migs"] = len(gpu.migs)
        print(json.dumps(fields, default=str))
        for proc in gpu.processes:
            print("  process: " + json.dumps(dataclasses.asdict(proc), default=str))


def _time_samples(pcie: bool, n: int) -> None:
    backend = NvmlBackend(interval=1.0, node="bench", pcie=pcie)
    _show(backend)
    time.sleep(1.0)  # the utilization samples' window
    walls, cpus = [], []
    for _ in range(n):
        w0, c0 = time.perf_counter(), time.thread_time()
        backend.sample()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.thread_time() - c0)
        time.sleep(0.2)
    backend.close()
    print(f"pcie={pcie}: sample wall median {statistics.median(walls) * 1e3:.2f} ms, max "
          f"{max(walls) * 1e3:.2f} ms; CPU median {statistics.median(cpus) * 1e3:.2f} ms "
          f"({n} samples)")


def _per_call(n: int) -> None:
    spent: dict[str, list[tuple[float, float]]] = {}

    def counted(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            w0, c0 = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent.setdefault(name, []).append((time.perf_counter() - w0,
                                                   time.thread_time() - c0))
        return wrapper

    for name in dir(pynvml):
        if name.startswith("nvml") and callable(getattr(pynvml, name)):
            setattr(pynvml, name, counted(name, getattr(pynvml, name)))
    backend = NvmlBackend(interval=1.0, node="bench")
    backend.sample()
    time.sleep(0.5)
    spent.clear()
    for _ in range(n):
        backend.sample()
        time.sleep(0.2)
    backend.close()
    calls = sum(len(v) for v in spent.values()) / n
    total = sum(w for v in spent.values() for w, _ in v) / n
    print(f"NVML calls per sample: {calls:.0f}, {total * 1e3:.2f} ms of wall time in them")
    for name, xs in sorted(spent.items(), key=lambda kv: -sum(w for w, _ in kv[1])):
        walls = [w for w, _ in xs]
        cpus = [c for _, c in xs]
        print(f"  {name:45} {len(xs) / n:4.0f}/sample  wall median "
              f"{statistics.median(walls) * 1e6:8.1f} us (max {max(walls) * 1e6:8.1f})  "
              f"CPU median {statistics.median(cpus) * 1e6:8.1f} us")


#: The --busy load: bf16 products on GPU 0 until killed (~2.6 GiB, SMs near 100 %).
_LOAD = """
import torch
a = torch.randn(16384, 16384, device="cuda", dtype=torch.bfloat16)
b = torch.randn(16384, 16384, device="cuda", dtype=torch.bfloat16)
print("load running", flush=True)
while True:
    c = a @ b
    torch.cuda.synchronize()
"""


def _start_load() -> subprocess.Popen[str]:
    load = subprocess.Popen([sys.executable, "-c", _LOAD], stdout=subprocess.PIPE, text=True)
    assert load.stdout is not None
    if load.stdout.readline().strip() != "load running":
        sys.exit(f"bench_nvml_real: the --busy load did not start (exit {load.wait()})")
    time.sleep(3.0)  # a few driver samples of the busy GPU
    print(f"busy: load pid {load.pid}; nvidia-smi sees:")
    smi = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                          "--format=csv"], check=False, capture_output=True, text=True)
    print(smi.stdout.strip() or smi.stderr.strip())
    return load


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=30)
    ap.add_argument("--busy", action="store_true",
                    help="measure while a PyTorch load runs on GPU 0")
    args = ap.parse_args()
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        sys.exit(f"bench_nvml_real: no NVIDIA driver to measure here ({e}); run it on a "
                 "GPU node")
    driver = pynvml.nvmlSystemGetDriverVersion()
    pynvml.nvmlShutdown()
    print(f"machine: {platform.machine()}, Python {platform.python_version()}, "
          f"NVIDIA driver {driver}, nvidia-ml-py {importlib.metadata.version('nvidia-ml-py')}")
    load = _start_load() if args.busy else None
    try:
        _time_samples(False, args.samples)
        _time_samples(True, max(5, args.samples // 3))
        _per_call(args.samples)
    finally:
        if load is not None:
            load.kill()
            load.wait()


if __name__ == "__main__":
    main()
