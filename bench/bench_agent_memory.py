"""Where the agent's memory goes: peak RSS of a fresh interpreter after each import set,
then the agent as deployed.

Each line imports its modules (and those of the lines above) in a new interpreter and
prints the peak RSS, so the difference between two lines is what those imports cost in
this process (native libraries, module objects and their data). The third part lists the
largest Python-level allocations (tracemalloc) after the agent's whole import set, by
top-level package: what is Python heap rather than mapped native code.

The Kubernetes client options (and aiohttp, which the agent no longer imports) are each
measured on top of the agent's set (not of each other); the ones not installed are
skipped. The first is the one in use: gpuscale's seam (kube/api.py, kube/credentials.py)
on lightkube's config and httpx2 client. To measure the others too (kubernetes_asyncio,
which it replaced, and kr8s):
    python3 -m venv /tmp/k && /tmp/k/bin/pip install -e . kubernetes_asyncio kr8s
    /tmp/k/bin/python bench/bench_agent_memory.py

The last part runs the real agent (``gpuscale agent``) for ``--run`` seconds at 1 Hz, set
up as a node of 8 H100s x 7 MIG 1g.10gb instances with 64 processes of 56 pods, every pod
an inference engine the agent scrapes (40 vLLM, 8 Triton, 8 TGI: the simulated engines of
engines/simulated.py at the pods' loopback IPs), attribution as in a cluster: the pods
watched on the test API server (tests/peers/kubeapi.py, lightkube's client loaded and in
use), their devices from the kubelet peer on a unix socket, PIDs mapped through a /proc
tree; the GPU readings are the simulated backend's for the same scenario. The telemetry
stream is served and one scaler-side subscriber reads it; /metrics is scraped every 15 s
as Prometheus would. It prints the agent's VmRSS and VmHWM (/proc/<pid>/status) at the
end and its CPU time over the window as % of one core.

Usage: .venv/bin/python bench/bench_agent_memory.py [--run 60]  (--run 0: imports only)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.proc import proc_cpu_seconds, proc_mem_mib  # noqa: E402

if TYPE_CHECKING:  # (at run time imported where used, as the rest of this file does)
    from gpuscale.attribution.model import PodInfo
    from gpuscale.telemetry.scenario import NodeSpec
    from tests.peers.kubeapi import KubeApiPeer
    from tests.peers.kubelet import KubeletPeer

STEPS: list[tuple[str, list[str]]] = [
    ("python itself", []),
    ("+ protobuf, grpcio", ["google.protobuf", "grpc"]),
    ("+ prometheus_client (its wsgiref server: /metrics)", ["prometheus_client"]),
    ("+ nvidia-ml-py, PyYAML", ["pynvml", "yaml"]),
    ("+ httpx2 (engine scrapes; kube/'s client)", ["httpx2"]),
    ("+ the agent (gpuscale.agent.app, cli)", ["gpuscale.agent.app", "gpuscale.cli.agent"]),
]

#: On top of the agent's set, each alone: the Kubernetes client in use and the ones it
#: replaced or could, and aiohttp, which the agent used before (engine scrapes, /metrics).
CLIENTS: list[tuple[str, list[str]]] = [
    ("lightkube (in use: kube.api, kube.credentials)",
     ["gpuscale.kube.api", "gpuscale.kube.credentials"]),
    ("lightkube's typed AsyncClient, core_v1 resources",
     ["lightkube", "lightkube.resources.core_v1"]),
    ("kubernetes_asyncio (before: its client, config)",
     ["kubernetes_asyncio.client", "kubernetes_asyncio.config"]),
    ("kr8s (kr8s.asyncio)", ["kr8s.asyncio"]),
    ("aiohttp, aiohttp.web (the agent's before)", ["aiohttp", "aiohttp.web"]),
]

# VmHWM, not getrusage's ru_maxrss: on Linux the latter keeps the peak of the forked
# parent from before exec, so it would measure this script.
_PROBE = """
import importlib, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
for line in open("/proc/self/status"):
    if line.startswith("VmHWM"):
        print(int(line.split()[1]) / 1024)
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


def imports() -> None:
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
          f"{sys.version.split()[0]}")
    print("peak RSS (VmHWM) of a fresh interpreter after importing (cumulative):")
    modules: list[str] = []
    before = None
    for label, names in STEPS:
        modules += names
        out = subprocess.run([sys.executable, "-c", _PROBE, *modules], capture_output=True,
                             text=True, check=True)
        rss = float(out.stdout.strip())
        step = "" if before is None else f"  (+{rss - before:.1f})"
        print(f"  {label:<52}{rss:7.1f} MiB{step}")
        before = rss
    assert before is not None
    agent = before
    print("on top of the agent's set (each alone):")
    for label, names in CLIENTS:
        out = subprocess.run([sys.executable, "-c", _PROBE, *modules, *names],
                             capture_output=True, text=True, check=False)
        if out.returncode != 0:
            print(f"  {label:<52}    not installed here")
            continue
        rss = float(out.stdout.strip())
        print(f"  {label:<52}{rss:7.1f} MiB  (+{rss - agent:.1f})")
    print("Python heap (tracemalloc) of the agent's set with the client in use, by package:")
    heap = subprocess.run([sys.executable, "-c", _HEAP, *modules, *CLIENTS[0][1]],
                          capture_output=True, text=True, check=True)
    print(heap.stdout.rstrip())


# -- the agent as deployed -------------------------------------------------------------

NODE = "gpu-node-0"
ENGINE_CYCLE = ("vllm",) * 5 + ("triton", "tgi")  # per MIG instance: 40 / 8 / 8 of 56


def deployed_scenario() -> dict[str, object]:
    """8 H100s x 7 MIG 1g.10gb; one engine pod per instance (56) and a second process in
    the first pod of each GPU (64 processes)."""
    procs: list[dict[str, object]] = []
    for g in range(8):
        for m in range(7):
            k = g * 7 + m
            engine = ENGINE_CYCLE[m]
            pod = {"namespace": "llm", "name": f"{engine}-{g}{m}-{k}", "container": engine,
                   "engine": engine}
            load = {"sine": {"base": 50, "amplitude": 40, "period_s": 120, "phase_s": k}}
            procs.append({"gpu": g, "mig": m, "memory": 0.8, "load": load, "pod": pod})
            if m == 0:
                procs.append({"gpu": g, "mig": m, "memory": 0.05, "pid": 5000 + g,
                              "load": {"constant": 5}, "pod": pod})
    return {"description": "bench: 8 x 7 MIG, 64 processes, 56 engine pods",
            "nodes": [{"name": NODE, "gpus": [{"model": "H100-SXM5-80GB", "count": 8,
                                               "sharing": "mig", "mig": ["1g.10gb"] * 7}],
                       "processes": procs}]}


class Records:
    """The subscriber's sink: the latest pod records of the node."""

    def __init__(self) -> None:
        self.latest: list[object] = []
        self.updates = 0

    def update_node(self, node: str, records: Iterable[object], devices: object = (),
                    stale_after: float = 0.0) -> None:
        self.latest = list(records)
        self.updates += 1

    def remove_node(self, node: str) -> None:
        self.latest = []




def cluster_peers(node: NodeSpec, infos: Mapping[tuple[str, str], PodInfo], tmp: Path,
                  ) -> tuple[KubeApiPeer, KubeletPeer, Path]:
    """The deployed agent's peers for ``node``: an API server with its pods, a kubelet that
    allocates their MIG slices, and a /proc tree that puts each process in its pod."""
    from gpuscale.telemetry.scenario import mig_uuid
    from tests.peers.kubeapi import KubeApiPeer, make_pod
    from tests.peers.kubelet import KubeletPeer, pod

    api = KubeApiPeer()
    api.bookmark_every = None
    for info in infos.values():
        obj = make_pod(info.namespace, info.name, info.uid, node=NODE, ip=info.ip,
                       owner=("ReplicaSet", info.name.rsplit("-", 1)[0]),
                       containers=info.container_ids, labels=dict(info.labels))
        obj["metadata"]["annotations"] = dict(info.annotations)
        api.add(obj)
    kubelet = KubeletPeer(Path(f"/tmp/gs-bench-{os.getpid()}.sock"))
    devices: dict[tuple[str, str, str], list[str]] = {}
    proc = tmp / "proc"
    (proc / "1").mkdir(parents=True)
    (proc / "1" / "cgroup").write_text("0::/init.scope\n")
    for p in node.processes:
        assert p.pod is not None and p.mig is not None
        info = infos[(p.pod.namespace, p.pod.name)]
        ids = devices.setdefault((p.pod.namespace, p.pod.name, p.pod.container), [])
        if mig_uuid(NODE, p.gpu, p.mig) not in ids:
            ids.append(mig_uuid(NODE, p.gpu, p.mig))
        cid = dict(info.container_ids)[p.pod.container]
        (proc / str(p.pid)).mkdir()
        (proc / str(p.pid) / "cgroup").write_text(
            f"0::/kubepods/besteffort/pod{info.uid}/{cid}\n")
    kubelet.pods = [pod(ns, name, (c, "nvidia.com/mig-1g.10gb", ids))
                    for (ns, name, c), ids in devices.items()]
    return api, kubelet, proc


def small_vllm_bodies() -> None:
    """The simulated vLLM serves its few lines only, as before its real-size body."""
    from gpuscale.engines.simulated_engines import SimulatedEngine
    from gpuscale.engines.vllm_body import unread_families
    rest, render = len(unread_families()), SimulatedEngine.render

    def small_render(self: SimulatedEngine, t: float) -> str:
        text = render(self, t)
        return text[:-rest] if self.engine == "vllm" else text

    SimulatedEngine.render = small_render  # type: ignore[method-assign]


async def deployed(seconds: float, warmup: float = 10.0, profile: str = "",
                   real_vllm: bool = False) -> None:
    from gpuscale.attribution.sources import ScenarioSources
    from gpuscale.engines.simulated_engines import engines_for, start_engines
    from gpuscale.stream.subscriber import AgentSubscriber
    from gpuscale.telemetry.model import Absent
    from gpuscale.telemetry.scenario import load_scenario
    from tests.support.kubeconfig import write_kubeconfig

    tmp = Path(tempfile.mkdtemp(prefix="gpuscale-bench-"))
    scenario_file = tmp / "scenario.yaml"
    scenario_file.write_text(json.dumps(deployed_scenario()))  # JSON is YAML
    node = load_scenario(str(scenario_file)).nodes[0]
    infos = ScenarioSources(node).pod_infos()  # the pods' IPs, UIDs, container IDs
    assert not isinstance(infos, Absent)

    api, kubelet, proc = cluster_peers(node, infos, tmp)
    loads = {(p.pod.namespace, p.pod.name): p.load for p in node.processes if p.pod}
    engines = engines_for(dict(infos), loads)
    if not real_vllm:  # the simulated vLLM's few lines only, as before its real-size body
        small_vllm_bodies()
    served = [0]
    t_start = time.monotonic()

    def clock() -> float:  # read once per request an engine answers: counts the scrapes
        served[0] += 1
        return time.monotonic() - t_start

    runners = await start_engines(engines, clock)
    await api.start()
    await kubelet.start()
    kubeconfig = write_kubeconfig(tmp / "kubeconfig", f"http://127.0.0.1:{api.port}",
                                  {"token": api.token})
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "NODE_NAME": NODE}
    log = tmp / "agent.log"  # a file, not a pipe nobody reads: a full pipe would stall it
    agent = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpuscale.cli", "--log-level", "WARNING", "agent",
        "--gpu-backend", "sim", "--scenario", str(scenario_file), "--attribution", "cluster",
        "--kubeconfig", str(kubeconfig), "--kubelet-socket", str(kubelet.socket_path),
        "--proc-root", str(proc), "--host", "127.0.0.1", "--port", "0",
        "--stream-port", "0", "--stream-insecure", "--interval", "1",
        env=env, stdout=asyncio.subprocess.PIPE, stderr=log.open("wb"))
    sink = Records()
    subscriber = AgentSubscriber(sink, "bench")
    try:
        assert agent.stdout is not None
        line = (await asyncio.wait_for(agent.stdout.readline(), 60)).decode()
        if "serving metrics at " not in line:
            raise SystemExit(f"agent did not start: {line}{log.read_text()[-4000:]}")
        url = line.split("at ")[1].split()[0]
        subscriber.set_addresses([f"127.0.0.1:{line.rsplit(':', 1)[1].strip()}"])
        await asyncio.sleep(warmup)  # imports done, the pod list in, first scrapes done
        spy = None
        if profile:  # py-spy samples from outside: the agent runs unmodified
            spy = await asyncio.create_subprocess_exec(
                str(Path(sys.executable).parent / "py-spy"), "record", "--pid",
                str(agent.pid), "--duration", str(int(seconds)), "--rate", "200",
                "--threads", "--format", "raw", "--output", profile,
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
        cpu0, t0, served0 = proc_cpu_seconds(agent.pid), time.monotonic(), served[0]
        scrapes, size, next_scrape = 0, 0, t0
        while time.monotonic() - t0 < seconds:
            if time.monotonic() >= next_scrape:
                body = await asyncio.to_thread(
                    lambda: urllib.request.urlopen(url, timeout=5).read())
                size, scrapes, next_scrape = len(body), scrapes + 1, next_scrape + 15.0
            await asyncio.sleep(0.2)
        elapsed = time.monotonic() - t0
        cpu = proc_cpu_seconds(agent.pid) - cpu0
        rss, hwm = proc_mem_mib(agent.pid)
        engine_scrapes = served[0] - served0
        if spy is not None:
            await spy.wait()
    finally:
        await subscriber.close()
        if agent.returncode is None:
            agent.terminate()
            await agent.wait()
        await kubelet.stop()
        await api.stop()
        await asyncio.gather(*(r.cleanup() for r in runners))
    numbers = [r for r in sink.latest
               if any(k.split("-")[0] in ("vllm", "triton", "tgi")
                      and not isinstance(v, Absent)
                      for k, v in r.signals.items())]  # type: ignore[attr-defined]
    print(f"the agent as deployed, {len(node.processes)} processes, {len(engines)} engine "
          f"pods{' (vLLM bodies of real size)' if real_vllm else ''}, {elapsed:.0f} s at "
          f"1 Hz after {warmup:.0f} s of warm-up:")
    print(f"  engine scrapes {engine_scrapes} ({engine_scrapes / elapsed:.1f}/s); "
          f"/metrics scraped {scrapes} times ({size / 1024:.0f} KiB); stream: "
          f"{sink.updates} updates, last {len(sink.latest)} pods, {len(numbers)} with engine "
          f"signals")
    print(f"  CPU {100 * cpu / elapsed:.2f} % of one core; VmRSS {rss:.1f} MiB, "
          f"VmHWM {hwm:.1f} MiB")
    warnings = [line for line in log.read_text().splitlines() if " WARNING " in line]
    print(f"  agent log: {len(warnings)} warnings{': ' + warnings[-1][:200] if warnings else ''}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=float, default=60.0,
                        help="seconds to measure the deployed agent (0: imports only)")
    parser.add_argument("--profile", default="", metavar="FILE",
                        help="also sample the agent with py-spy over the window and write "
                             "its collapsed stacks to FILE (the sampling costs the agent "
                             "CPU: take CPU figures from runs without it)")
    parser.add_argument("--real-vllm-body", action="store_true",
                        help="(the default now: the simulated vLLM engines answer with a "
                             "body of real size, engines/vllm_body.py, ~70 KiB)")
    parser.add_argument("--small-vllm-body", action="store_true",
                        help="vLLM engines answer with the families gpuscale reads only "
                             "(~20 lines), as the simulated engine did before")
    parser.add_argument("--no-imports", action="store_true",
                        help="skip the import part (the deployed run only)")
    args = parser.parse_args()
    if not args.no_imports:
        imports()
    if args.run > 0:
        asyncio.run(deployed(args.run, profile=args.profile,
                            real_vllm=not args.small_vllm_body))


if __name__ == "__main__":
    main()
