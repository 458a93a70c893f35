"""PID -> pod from /proc/<pid>/cgroup: real-world lines of each runtime and cgroup version."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuscale.attribution.cgroup import PidResolver, parse_cgroup
from gpuscale.attribution.model import ProcessOwner
from gpuscale.telemetry.model import Absent
from tests.support.polling import until_sync

UID = "1f2e3d4c-5b6a-4789-8abc-def012345678"
U_ = UID.replace("-", "_")
CID = "4c8f1e2d3b5a69788796a5b4c3d2e1f0" * 2

CASES = {
    "v2 systemd containerd burstable":
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{U_}.slice/"
        f"cri-containerd-{CID}.scope\n",
    "v2 systemd containerd guaranteed":
        f"0::/kubepods.slice/kubepods-pod{U_}.slice/cri-containerd-{CID}.scope\n",
    "v2 systemd cri-o":
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{U_}.slice/"
        f"crio-{CID}.scope\n",
    "v2 cgroupfs containerd": f"0::/kubepods/burstable/pod{UID}/{CID}\n",
    "v1 cgroupfs docker": "".join(
        f"{i}:{c}:/kubepods/besteffort/pod{UID}/{CID}\n"
        for i, c in enumerate(["cpuset", "cpu,cpuacct", "memory", "devices", "pids"], 2))
        + "1:name=systemd:/system.slice/docker.service\n",
    "v1 systemd docker": "".join(
        f"{i}:{c}:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{U_}.slice/"
        f"docker-{CID}.scope\n" for i, c in enumerate(["memory", "devices"], 3)),
    "v1+v2 hybrid systemd containerd":
        f"12:devices:/kubepods.slice/kubepods-pod{U_}.slice/cri-containerd-{CID}.scope\n"
        f"0::/kubepods.slice/kubepods-pod{U_}.slice/cri-containerd-{CID}.scope\n",
    "kind (nested kubelet.slice)":
        f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
        f"kubelet-kubepods-besteffort-pod{U_}.slice/cri-containerd-{CID}.scope\n",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_runtime_and_cgroup_versions(case: str) -> None:
    assert parse_cgroup(CASES[case]) == ProcessOwner(UID, CID)


@pytest.mark.parametrize(("text", "expected"), [
    ("0::/init.scope\n", None),
    ("0::/system.slice/containerd.service\n", None),
    ("0::/user.slice/user-1000.slice/session-3.scope\n", None),
    (f"0::/kubepods.slice/kubepods-pod{U_}.slice/crio-conmon-{CID}.scope\n",
     ProcessOwner(UID, "")),  # CRI-O's monitor process lives in the pod, not a container
    (f"0::/kubepods/pod{UID}\n", ProcessOwner(UID, "")),
    ("", None),
    ("garbage without colons\n", None),
    (f"0::/kubepods/podnot-a-uid/{CID}\n", None),
])
def test_non_pod_and_odd_cgroups(text: str, expected: ProcessOwner | None) -> None:
    assert parse_cgroup(text) == expected


@given(st.text(max_size=500))
def test_arbitrary_text_never_raises(text: str) -> None:
    result = parse_cgroup(text)
    assert result is None or len(result.pod_uid) == 36


def proc_tree(root: Path, init: str, pids: dict[int, str]) -> Path:
    for pid, text in {1: init, **pids}.items():
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "cgroup").write_text(text)
    return root


def test_resolver_on_a_fixture_proc_tree(tmp_path: Path) -> None:
    root = proc_tree(tmp_path, "0::/init.scope\n", {
        100: CASES["v2 systemd cri-o"], 200: "0::/system.slice/nv-hostengine.service\n"})
    resolver = PidResolver(root)
    assert resolver.available() == (True, "ok")
    owners = resolver.owners([100, 200, 300])
    assert owners == {100: ProcessOwner(UID, CID), 200: None, 300: None}


def test_without_host_pid_the_resolver_says_so(tmp_path: Path) -> None:
    root = proc_tree(tmp_path, CASES["v2 cgroupfs containerd"], {})
    ok, why = PidResolver(root).available()
    assert not ok
    assert "hostPID is not enabled" in why
    assert PidResolver(root).owners([1]) is Absent.UNAVAILABLE
    assert PidResolver(tmp_path / "nothing").available()[0] is False


def test_huge_cgroup_file_is_read_bounded(tmp_path: Path) -> None:
    root = proc_tree(tmp_path, "0::/init.scope\n",
                     {5: ("9:x:/" + "a" * 100 + "\n") * 10_000 + CASES["v2 systemd cri-o"]})
    # The pod line lies past the 64 KiB bound: not read, so no owner - and no hang.
    assert PidResolver(root).owners([5]) == {5: None}


def test_owners_are_cached_per_process_and_a_reused_pid_is_read_again(tmp_path: Path) -> None:
    root = proc_tree(tmp_path, "0::/init.scope\n", {42: CASES["v2 systemd cri-o"]})
    resolver = PidResolver(root)
    assert resolver.owners([42]) == {42: ProcessOwner(UID, CID)}
    # The same process: its cgroup file is not read again (a change would not be seen).
    (root / "42" / "cgroup").write_text("0::/init.scope\n")
    assert resolver.owners([42]) == {42: ProcessOwner(UID, CID)}
    # PID 42 exits and is reused by a process outside any pod: a new /proc/42 entry.
    # The resolver tells the two apart by the entry's ctime (the process's start time), so
    # the new entry must have another one. The kernel sets ctime from its own clock, which
    # may be coarser than this test is fast: touch the entry until its ctime has moved.
    started = os.stat(root / "42").st_ctime_ns
    shutil.rmtree(root / "42")
    (root / "42").mkdir()

    def touched() -> bool:
        os.utime(root / "42")
        return os.stat(root / "42").st_ctime_ns != started

    until_sync(touched, within=5, every=0.001, what="a new ctime on the reused /proc/42")
    (root / "42" / "cgroup").write_text("0::/system.slice/sshd.service\n")
    assert resolver.owners([42]) == {42: None}
