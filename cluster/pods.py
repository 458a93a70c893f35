"""The kubelet stand-in for the simulated nodes: runs what each pod stands for.

Every second it lists the real API's pods on the simulated nodes and
- keeps each GPU node's PodResources socket (``kubelet``) in step with them and with the
  DRA claims the real scheduler allocated for them (``dra``);
- runs gpuscale's own pods (the agent DaemonSet, the scaler Deployment, as deployed from
  our manifests) as processes bound to their pod IPs, with the pod's own arguments and
  only what a node would give differently: simulated GPUs, the node's PodResources socket,
  and the pod's service-account token in a kubeconfig (so our RBAC is what is exercised);
- serves a simulated engine on every Ready inference pod (``engines``);
- writes the namespace's hosts file from the EndpointSlices (``dns``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cluster import dns, dra, volumes
from cluster.engines import (
    BATCH_ANNOTATION,
    DEFAULT_BATCH,
    Engines,
    Gateway,
    read_load,
    shares,
    workload_key,
)
from cluster.kubelet import NodeDevices
from cluster.layout import Layout
from cluster.nodes import DEFAULT_NODES, NodeShape, devices, locations, scenario
from gpuscale.engines.scrape import ANNOTATION, PORT_ANNOTATION
from gpuscale.kube.api import KubeApi

log = logging.getLogger("cluster.pods")
COMPONENT = "app.kubernetes.io/component"
RESTART_BACKOFF_S = 10.0
GPU_LOAD = "gpuscale.io/sim-gpu-load"  # percent, for a GPU pod without an engine
ENGINE_DOWN = "gpuscale.io/sim-engine-down"  # "true": the pod's engine stops answering
GPUSCALE = Path(sys.executable).parent / "gpuscale"


def _ready(pod: Mapping[str, Any]) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def _running(pod: Mapping[str, Any]) -> bool:
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    return (status.get("phase") == "Running" and bool(status.get("podIP"))
            and not meta.get("deletionTimestamp"))


def _claimed(node: NodeDevices, uid: str, node_name: str
             ) -> list[tuple[str, str, tuple[int, int | None]]]:
    """(container, device key, (GPU index, None)) of each GPU the pod's DRA claims hold:
    its simulated process runs on the GPU the scheduler allocated."""
    out: list[tuple[str, str, tuple[int, int | None]]] = []
    for container, claims in node.claims.get(uid, {}).items():
        for k in claims:
            for driver, pool, device in k.devices:
                gpu = dra.gpu_index(driver, pool, device, node_name)
                if gpu is not None:
                    out.append((container, f"{k.namespace}/{k.name}/{device}", (gpu, None)))
    return out


@dataclass
class Proc:
    argv: list[str]
    popen: subprocess.Popen[bytes]
    started: float = field(default_factory=time.monotonic)


@dataclass
class PodRunner:
    layout: Layout
    api: KubeApi
    kubectl: Path
    shapes: tuple[NodeShape, ...] = DEFAULT_NODES
    nodes: dict[str, NodeDevices] = field(default_factory=dict)
    procs: dict[str, Proc] = field(default_factory=dict)
    engines: Engines = field(default_factory=Engines)
    gateway: Gateway = field(default_factory=Gateway)
    tokens: dict[str, Path] = field(default_factory=dict)
    scenario_text: dict[str, str] = field(default_factory=dict)
    pids: dict[tuple[str, str], int] = field(default_factory=dict)
    where: dict[str, dict[str, tuple[int, int | None]]] = field(default_factory=dict)

    async def start(self) -> None:
        await self.gateway.start(self.layout.host_pod_ip)
        for shape in self.shapes:
            if not shape.gpus:
                continue
            d = self.layout.root / "nodes" / shape.name
            d.mkdir(parents=True, exist_ok=True)
            (d / "scenario.yaml").write_text(yaml.safe_dump(scenario(shape), sort_keys=False))
            node = NodeDevices(shape.name, devices(shape), d / "kubelet.sock")
            await node.peer.start()
            self.nodes[shape.name] = node

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.tick()
            except Exception:
                log.exception("pod runner tick failed; next in 1 s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)

    async def tick(self) -> None:
        pods = (await self.api.get_raw("/api/v1/pods")).get("items") or []
        ours = [p for p in pods if (p.get("spec") or {}).get("nodeName") in
                {s.name for s in self.shapes}]
        claims = dra.index_claims(
            (await self.api.get_raw("/apis/resource.k8s.io/v1/resourceclaims")).get("items")
            or []) if any(s.dra for s in self.shapes) else {}
        for name, node in self.nodes.items():
            node.sync((p for p in ours if p["spec"]["nodeName"] == name), claims)
        await self._processes(ours)
        await self._engines(ours)
        self._gpu_processes({p["metadata"]["uid"]: p for p in ours})
        slices = (await self.api.get_raw("/apis/discovery.k8s.io/v1/endpointslices"))
        hosts = dns.hosts_dir(self.layout.netns) / "hosts"
        if dns.write_in_place(hosts, dns.render(slices.get("items") or [])):
            log.info("hosts file rewritten")

    async def _processes(self, pods: list[dict[str, Any]]) -> None:
        want: dict[str, dict[str, Any]] = {}
        for p in pods:
            labels = (p.get("metadata") or {}).get("labels") or {}
            if labels.get("app.kubernetes.io/name") == "gpuscale" and _running(p):
                want[p["metadata"]["uid"]] = p
        for uid in set(self.procs) - set(want):
            self._kill(uid)
        for uid, p in want.items():
            mounts = await volumes.materialize(self.api, p, self.layout.root)
            proc = self.procs.get(uid)
            if proc is not None and proc.popen.poll() is None:
                continue
            argv = self._argv(p, mounts)
            if argv is None:
                continue
            if proc is not None:
                # As a kubelet restarts a failed container: after a back-off, logged.
                if time.monotonic() - proc.started < RESTART_BACKOFF_S:
                    continue
                log.warning("%s exited with %s; restarting", p["metadata"]["name"],
                            proc.popen.returncode)
            self.procs[uid] = self._spawn(p, argv)

    def _argv(self, pod: dict[str, Any], mounts: dict[str, Path]) -> list[str] | None:
        meta, spec = pod["metadata"], pod["spec"]
        container = (spec.get("containers") or [{}])[0]
        args = volumes.rewrite([str(a) for a in container.get("args") or []], mounts)
        ip, node = pod["status"]["podIP"], spec["nodeName"]
        kc = self._token_kubeconfig(meta["namespace"], spec.get("serviceAccountName", "default"))
        component = (meta.get("labels") or {}).get(COMPONENT)
        if component == "agent":
            shape = next(s for s in self.shapes if s.name == node)
            if shape.amd or node not in self.nodes:
                return None  # AMD nodes: no simulated AMD agent yet
            d = self.layout.root / "nodes" / node
            return [str(GPUSCALE), *args, f"--host={ip}", "--gpu-backend=sim",
                    f"--scenario={d / 'scenario.yaml'}", f"--node={node}",
                    "--attribution=cluster", f"--kubelet-socket={d / 'kubelet.sock'}",
                    f"--kubeconfig={kc}", f"--node-name={node}"]
        if component == "scaler":
            return [str(GPUSCALE), *args, f"--host={ip}", f"--kubeconfig={kc}"]
        return None

    def _spawn(self, pod: dict[str, Any], argv: list[str]) -> Proc:
        meta = pod["metadata"]
        logs = self.layout.logs / "pods"
        logs.mkdir(parents=True, exist_ok=True)
        env = {"NODE_NAME": pod["spec"]["nodeName"], "PATH": "/usr/bin:/bin"}
        with (logs / f"{meta['namespace']}_{meta['name']}.log").open("ab") as out:
            popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        log.info("started %s/%s: %s", meta["namespace"], meta["name"], " ".join(argv))
        return Proc(argv, popen)

    def _kill(self, uid: str) -> None:
        proc = self.procs.pop(uid)
        proc.popen.terminate()
        try:
            proc.popen.wait(10)
        except subprocess.TimeoutExpired:
            proc.popen.kill()
            proc.popen.wait()

    def _token_kubeconfig(self, namespace: str, account: str) -> Path:
        """A kubeconfig holding a token of the pod's service account (TokenRequest)."""
        key = f"{namespace}-{account}"
        if key in self.tokens:
            return self.tokens[key]
        token = subprocess.run(
            [str(self.kubectl), f"--kubeconfig={self.layout.kubeconfig}", "create", "token",
             account, "-n", namespace, "--duration=48h"],
            capture_output=True, text=True, check=True).stdout.strip()
        admin = yaml.safe_load(self.layout.kubeconfig.read_text())
        admin["users"] = [{"name": "admin", "user": {"token": token}}]
        path = self.layout.root / "tokens" / f"{key}.kubeconfig"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(admin))
        path.chmod(0o600)
        self.tokens[key] = path
        return path

    async def _engines(self, pods: list[dict[str, Any]]) -> None:
        serving = {p["metadata"]["uid"]: p for p in pods
                   if ((p["metadata"].get("annotations") or {}).get(ANNOTATION)
                       and (p["metadata"].get("annotations") or {}).get(ENGINE_DOWN) != "true"
                       and _running(p) and _ready(p))}
        for uid in set(self.engines.runners) - set(serving):
            await self.engines.stop(uid)
        for uid, p in serving.items():
            if uid in self.engines.runners:
                continue
            ann = p["metadata"].get("annotations") or {}
            try:
                port, batch = int(ann.get(PORT_ANNOTATION, "8000")), int(
                    ann.get(BATCH_ANNOTATION, DEFAULT_BATCH))
                await self.engines.start(uid, p["status"]["podIP"], port, max(1, batch))
            except (ValueError, OSError) as e:
                log.warning("engine of %s not served: %s", p["metadata"]["name"], e)
        load = read_load(self.layout.root / "load.json")
        by_workload: dict[str, list[str]] = {}
        for uid, p in serving.items():
            by_workload.setdefault(workload_key(p), []).append(uid)
        for key, uids in by_workload.items():
            for uid, n in shares(load.get(key, 0), uids).items():
                self.engines.set_load(uid, n)
        # The gateway holds what no Ready pod can take; every workload it knows has a
        # sample (0 when its pods take the load), as a real gateway's gauge would.
        self.gateway.pending = {k: 0 if k in by_workload else n for k, n in load.items()}
        for key in by_workload:
            self.gateway.pending.setdefault(key, 0)

    def _gpu_processes(self, pods: dict[str, dict[str, Any]]) -> None:
        """Each node's scenario: one simulated process per device a pod holds, as busy as
        its engine (running / batch), or as ``gpuscale.io/sim-gpu-load`` says."""
        for shape in self.shapes:
            node = self.nodes.get(shape.name)
            if node is None:
                continue
            where = self.where.setdefault(shape.name, locations(shape))
            procs: list[dict[str, Any]] = []
            for uid, (ns, name, assignment) in sorted(node.held.items()):
                held = [(c, d, where.get(d, (-1, None))) for c, by_res in assignment.items()
                        for ids in by_res.values() for d in ids]
                held += _claimed(node, uid, shape.name)
                for container, d, (gpu, mig) in held:
                    if gpu < 0:
                        continue
                    procs.append({
                        "gpu": gpu, **({"mig": mig} if mig is not None else {}),
                        "pid": self._pid(uid, d), "memory": 0.9,
                        "load": {"constant": self._busy(uid, pods.get(uid))},
                        "pod": {"namespace": ns, "name": name, "container": container}})
            text = yaml.safe_dump(scenario(shape, procs), sort_keys=False)
            path = self.layout.root / "nodes" / shape.name / "scenario.yaml"
            if self.scenario_text.get(shape.name) != text:
                tmp = path.with_suffix(".tmp")
                tmp.write_text(text)
                tmp.replace(path)
                self.scenario_text[shape.name] = text

    def _busy(self, uid: str, pod: dict[str, Any] | None) -> float:
        st = self.engines.state.get(uid)
        if st is not None:
            return round(100.0 * st.running / max(1, st.batch), 1)
        ann = ((pod or {}).get("metadata") or {}).get("annotations") or {}
        try:
            return max(0.0, min(100.0, float(ann.get(GPU_LOAD, "0"))))
        except ValueError:
            return 0.0

    def _pid(self, uid: str, device: str) -> int:
        return self.pids.setdefault((uid, device), 10_000 + len(self.pids))

    async def close(self) -> None:
        for uid in list(self.procs):
            self._kill(uid)
        await self.engines.close()
        await self.gateway.close()
        for node in self.nodes.values():
            await node.peer.stop()


async def _main(layout: Layout, bin_dir: Path) -> None:
    import signal

    from gpuscale.kube.connect import connect

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    api = await connect(layout.kubeconfig)
    runner = PodRunner(layout, api, bin_dir / "kubectl")
    try:
        await runner.start()
        await runner.run(stop)
    finally:
        await runner.close()
        await api.close()


def main() -> None:
    import argparse

    p = argparse.ArgumentParser(prog="cluster.pods")
    p.add_argument("--root", type=Path, required=True)
    p.add_argument("--slot", type=int, default=0)
    p.add_argument("--bin", type=Path, required=True)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    for noisy in ("httpx", "httpx2", "httpcore"):  # a line per request, every second
        logging.getLogger(noisy).setLevel(logging.WARNING)
    asyncio.run(_main(Layout(args.root, args.slot), args.bin))


if __name__ == "__main__":
    main()
