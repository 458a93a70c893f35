"""Where a node command's readings and attribution come from (``agent``, ``gpus``)."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from gpuscale.attribution.cgroup import PidResolver
from gpuscale.attribution.kubelet import DEFAULT_SOCKET, PodResourcesClient
from gpuscale.attribution.sources import (
    AttributionSources,
    ClusterSources,
    ScenarioSources,
    cluster_sources,
)
from gpuscale.telemetry.backend import GpuBackend
from gpuscale.telemetry.model import BackendState
from gpuscale.telemetry.scenario import ScenarioError, builtin_scenarios, load_scenario
from gpuscale.telemetry.scenario_file import ScenarioFile
from gpuscale.telemetry.simulated_gpus import SimulatedBackend

log = logging.getLogger("gpuscale")

DEFAULT_SCENARIO = "h100-vllm"


def add_backend_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpu-backend", choices=["auto", "nvml", "amd", "sim"], default="auto",
                   help="where readings come from: nvml (NVIDIA), amd (AMD Instinct, through "
                        "amdsmi and ROCm's libamd_smi.so), sim; auto = NVML when it sees a "
                        "GPU, else AMD SMI when it does, else the simulated scenario "
                        "(default: auto)")
    p.add_argument("--scenario", default=None,
                   help="simulated fleet: a YAML file or a shipped scenario "
                        f"({', '.join(builtin_scenarios())}); default {DEFAULT_SCENARIO}; "
                        "naming one implies --gpu-backend sim. "
                        "A file is followed: when it changes, the node's processes and "
                        "their load are read again (its GPUs stay as at start; a file "
                        "that is missing or invalid keeps the last good processes)")
    p.add_argument("--node", default=None,
                   help="which node of the scenario to simulate (default: the first)")
    p.add_argument("--speed", type=float, default=1.0,
                   help="simulated time runs this many times faster than real time")
    p.add_argument("--pcie", action="store_true",
                   help="read PCIe throughput (NVML blocks ~20 ms per GPU per reading)")
    a = p.add_argument_group("attribution (which pod uses which GPU)")
    a.add_argument("--attribution", choices=["auto", "cluster", "scenario", "off"],
                   default="auto", help="auto: from the scenario with simulated GPUs, from "
                                        "the kubelet, API and /proc with NVML")
    a.add_argument("--kubelet-socket", type=Path, default=DEFAULT_SOCKET,
                   help=f"kubelet PodResources socket (default {DEFAULT_SOCKET})")
    a.add_argument("--kubeconfig", type=Path, default=None,
                   help="kubeconfig for the pod watch (default: in-cluster credentials, "
                        "else $KUBECONFIG or ~/.kube/config)")
    a.add_argument("--node-name", default=os.environ.get("NODE_NAME", ""),
                   help="this node's Kubernetes name (default $NODE_NAME)")
    a.add_argument("--proc-root", type=Path, default=Path("/proc"),
                   help="host /proc for PID -> pod (needs hostPID; default /proc)")
    a.add_argument("--sys-root", type=Path, default=Path("/sys"),
                   help="host sysfs: which device-plugin device each AMD partition is "
                        "(default /sys)")
    a.add_argument("--extra-resource", action="append", default=[],
                   help="another extended resource name whose devices are GPUs (repeatable)")
    a.add_argument("--dra-ignore-driver", action="append", default=[], metavar="DRIVER",
                   help="a DRA driver whose devices are not GPUs (a NIC's): its claims are "
                        "left out, not unknown (repeatable)")


def make_backend(args: argparse.Namespace) -> GpuBackend:
    """The backend the arguments ask for. ``auto`` takes NVML when it sees at least one GPU,
    else the simulated scenario; with a ``--scenario`` named, the scenario (no NVML probe,
    nor its warnings). ScenarioError for a scenario that cannot be used, or named with a
    hardware backend."""
    kind, scenario = args.gpu_backend, args.scenario or DEFAULT_SCENARIO
    if args.scenario is not None:
        if kind not in ("auto", "sim"):
            raise ScenarioError(f"--scenario simulates GPUs: not with --gpu-backend {kind}")
        kind = "sim"
    node_name = getattr(args, "hostname", "") or args.node_name
    if kind == "amd":
        from gpuscale.telemetry.amdsmi_backend import AmdSmiBackend

        return AmdSmiBackend(node_name or None, sys_root=args.sys_root)
    if kind in ("nvml", "auto"):
        from gpuscale.telemetry.nvml import NvmlBackend

        nvml = NvmlBackend(pcie=args.pcie, interval=getattr(args, "interval", 1.0),
                           node=node_name)
        if kind == "nvml":
            return nvml
        probe = nvml.sample()
        if probe.state is BackendState.OK and probe.gpus:
            return nvml
        nvml.close()
        why = probe.reason if probe.state is not BackendState.OK else "no GPUs"
        from gpuscale.telemetry.amdsmi_backend import AmdSmiBackend, present

        if present():  # an AMD GPU stack (/dev/kfd): ask AMD SMI
            amd = AmdSmiBackend(node_name or None, sys_root=args.sys_root)
            amd_probe = amd.sample()
            if amd_probe.state is BackendState.OK and amd_probe.gpus:
                log.info("NVML not usable here (%s): AMD SMI sees %d GPUs", why,
                         len(amd_probe.gpus))
                return amd
            amd.close()
            why += "; AMD SMI: " + (amd_probe.reason if amd_probe.state is not BackendState.OK
                                    else "no GPUs")
        log.warning("NVML not usable here (%s): using simulated GPUs from scenario %r",
                    why, scenario)
    if scenario in builtin_scenarios():  # shipped with gpuscale: never changes
        return SimulatedBackend(load_scenario(scenario).node(args.node), speed=args.speed,
                                pcie=args.pcie)
    followed = ScenarioFile(Path(scenario), args.node)
    return SimulatedBackend(followed.node, speed=args.speed, pcie=args.pcie,
                            follow=followed.poll)


async def make_sources(args: argparse.Namespace, backend: GpuBackend,
                       watch_pods: bool = True) -> AttributionSources | None:
    """Attribution inputs matching the backend (see --attribution). ``watch_pods``: for
    an agent (a one-shot reading passes False): the pod watch, and on simulated GPUs the
    scenario's inference engines served at the pods' addresses."""
    mode = args.attribution
    if mode == "auto":
        mode = "scenario" if isinstance(backend, SimulatedBackend) else "cluster"
    if mode == "off":
        return None
    if mode == "scenario":
        if not isinstance(backend, SimulatedBackend):
            raise ScenarioError("--attribution scenario needs the simulated backend")
        if watch_pods:  # an agent: it scrapes the engines it advertises, so serves them
            from gpuscale.engines.scenario_engines import ServedScenarioSources

            return ServedScenarioSources(lambda: backend.node, backend.scenario_time,
                                         getattr(args, "interval", 1.0))
        return ScenarioSources(lambda: backend.node)  # the node as last sampled
    if not watch_pods:
        return ClusterSources(PodResourcesClient(args.kubelet_socket,
                                                 tuple(args.extra_resource),
                                                 dra_ignore=tuple(args.dra_ignore_driver)),
                              None,
                              PidResolver(args.proc_root), pods_missing_reason="not watched")
    return await cluster_sources(args.kubelet_socket, args.node_name, args.proc_root,
                                 args.kubeconfig, tuple(args.extra_resource),
                                 tuple(args.dra_ignore_driver))
