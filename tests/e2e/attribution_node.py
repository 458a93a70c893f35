"""The node the attribution end-to-end tests run: the shipped time-slicing scenario (GPU 0
shared by four pods), the pods' uids and container ids, and the peers and /proc tree set up
for it (the ``cluster`` fixture, tests/e2e/conftest.py)."""

from __future__ import annotations

from pathlib import Path

from gpuscale.telemetry.scenario import gpu_uuid, load_scenario
from tests.peers.kubeapi import KubeApiPeer, make_pod
from tests.peers.kubelet import KubeletPeer, pod

NODE = load_scenario("timesliced-node").nodes[0]  # GPU 0: 4 pods time-slicing


def uid(i: int) -> str:
    return f"aaaaaaaa-0000-4000-8000-{i:012d}"


def cid(i: int) -> str:
    return f"{i:064x}"


def sharing_cluster(kubelet: KubeletPeer, api: KubeApiPeer,
                    tmp_path: Path) -> tuple[KubeletPeer, KubeApiPeer, Path]:
    g0 = gpu_uuid(NODE.name, 0)
    # The four time-slicing pods of GPU 0 (pids 7001-7004 in the scenario).
    kubelet.pods = [pod("dev", f"ts-{c}", ("app", "nvidia.com/gpu.shared", [f"{g0}::{i}"]))
                    for i, c in enumerate("abcd")]
    for i, c in enumerate("abcd"):
        api.add(make_pod("dev", f"ts-{c}", uid(i), node=NODE.name,
                         containers=(("app", cid(i)),)))
    proc = tmp_path / "proc"
    for pid, text in {1: "0::/init.scope\n",
                      **{7001 + i: f"0::/kubepods/besteffort/pod{uid(i)}/{cid(i)}\n"
                         for i in range(4)},
                      7101: "0::/system.slice/stray.service\n"}.items():
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text(text)
    return kubelet, api, proc


