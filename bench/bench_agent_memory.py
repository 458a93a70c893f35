"""Where the agent's memory goes: peak RSS of a fresh interpreter after each import set.

Each line imports its modules (and those of the lines above) in a new interpreter and
prints the peak RSS, so the difference between two lines is what those imports cost in
this process (native libraries, module objects and their data). The last part lists the
largest Python-level allocations (tracemalloc) after the agent's whole import set, by
top-level package: what is Python heap rather than mapped native code.

The Kubernetes client options are each measured on top of the agent's set (not of each
other); the ones not installed are skipped. The first is the one in use: gpuscale's seam
(kube/api.py, kube/credentials.py) on lightkube's config and httpx2 client. To measure the
others too (kubernetes_asyncio, which it replaced, and kr8s):
    python3 -m venv /tmp/k && /tmp/k/bin/pip install -e . kubernetes_asyncio kr8s
    /tmp/k/bin/python bench/bench_agent_memory.py

Usage: .venv/bin/python bench/bench_agent_memory.py
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys

STEPS: list[tuple[str, list[str]]] = [
    ("python itself", []),
    ("+ protobuf, grpcio (+ health, reflection)",
     ["google.protobuf", "grpc", "grpc_health.v1.health", "grpc_reflection.v1alpha.reflection"]),
    ("+ aiohttp (engine scrapes, /metrics)", ["aiohttp", "aiohttp.web"]),
    ("+ prometheus_client", ["prometheus_client"]),
    ("+ nvidia-ml-py, PyYAML", ["pynvml", "yaml"]),
    ("+ the agent (gpuscale.agent.app, cli)", ["gpuscale.agent.app", "gpuscale.cli.agent"]),
]

#: Kubernetes clients, each on top of the agent's set: the one in use, and lighter ones.
CLIENTS: list[tuple[str, list[str]]] = [
    ("lightkube (in use: kube.api, kube.credentials)",
     ["gpuscale.kube.api", "gpuscale.kube.credentials"]),
    ("lightkube's typed AsyncClient, core_v1 resources",
     ["lightkube", "lightkube.resources.core_v1"]),
    ("kubernetes_asyncio (before: its client, config)",
     ["kubernetes_asyncio.client", "kubernetes_asyncio.config"]),
    ("kr8s (kr8s.asyncio)", ["kr8s.asyncio"]),
]

_PROBE = """
import importlib, resource, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""

_HEAP = """
import importlib, sys, tracemalloc
tracemalloc.start(40)
for name in sys.argv[1:]:
    importlib.import_module(name)


def owner(frames):
    # The innermost frame in a package or the standard library: the module being loaded
    # (the import machinery's own frames are frozen and say nothing).
    for frame in reversed(frames):
        path = frame.filename
        for marker, kind in (("site-packages/", "pkg"), ("/src/", "pkg"),
                             ("lib/python3", "stdlib")):
            if marker in path:
                rest = path.split(marker, 1)[1].split("/")
                return rest[0].removesuffix(".py") if kind == "pkg" else "(stdlib)"
    return "(interpreter)"


by_package = {}
for stat in tracemalloc.take_snapshot().statistics("traceback"):
    key = owner(stat.traceback)
    by_package[key] = by_package.get(key, 0) + stat.size
for key, size in sorted(by_package.items(), key=lambda kv: -kv[1])[:10]:
    print(f"{size / 2**20:8.1f} MiB  {key}")
print(f"{sum(by_package.values()) / 2**20:8.1f} MiB  in all")
"""


def main() -> None:
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
          f"{sys.version.split()[0]}")
    print("peak RSS of a fresh interpreter after importing (cumulative):")
    modules: list[str] = []
    before = None
    for label, names in STEPS:
        modules += names
        out = subprocess.run([sys.executable, "-c", _PROBE, *modules], capture_output=True,
                             text=True, check=True)
        rss = float(out.stdout.strip())
        step = "" if before is None else f"  (+{rss - before:.1f})"
        print(f"  {label:<48}{rss:7.1f} MiB{step}")
        before = rss
    assert before is not None
    agent = before
    print("a Kubernetes client on top of the agent's set (each alone):")
    for label, names in CLIENTS:
        out = subprocess.run([sys.executable, "-c", _PROBE, *modules, *names],
                             capture_output=True, text=True, check=False)
        if out.returncode != 0:
            print(f"  {label:<48}    not installed here")
            continue
        rss = float(out.stdout.strip())
        print(f"  {label:<48}{rss:7.1f} MiB  (+{rss - agent:.1f})")
    print("Python heap (tracemalloc) of the agent's set with the client in use, by package:")
    heap = subprocess.run([sys.executable, "-c", _HEAP, *modules, *CLIENTS[0][1]],
                          capture_output=True, text=True, check=True)
    print(heap.stdout.rstrip())


if __name__ == "__main__":
    main()
