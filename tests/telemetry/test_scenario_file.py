"""A simulated node follows its scenario file: rewritten while the backend runs, the next
sample shows the new processes; bad rewrites and changed GPUs lose nothing."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuscale.telemetry.catalog import MIB
from gpuscale.telemetry.model import NodeSnapshot
from gpuscale.telemetry.scenario import ScenarioError
from gpuscale.telemetry.scenario_file import ScenarioFile
from gpuscale.telemetry.simulated_gpus import SimulatedBackend

LOGGER = "gpuscale.telemetry.scenario_file"
L4_MIB = 23034


def proc(gpu: int, pid: int, load: float, **kw: Any) -> dict[str, Any]:
    return {"gpu": gpu, "pid": pid, "memory": 0.5, "load": {"constant": load}, **kw}


def doc(*procs: dict[str, Any], gpus: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"nodes": [{"name": "n1", "gpus": gpus or [{"model": "L4", "count": 2}],
                       "processes": list(procs)}]}


class Node:
    """A scenario file, a backend following it on a hand-moved clock, and the file's
    rewrites: atomic (a temp file renamed over it, as the stand-in kubelet writes) and each
    with its own modification time, so no test waits for the file system's clock."""

    def __init__(self, path: Path, first: dict[str, Any],
                 stat: Callable[[Path], os.stat_result] = os.stat) -> None:
        self.path = path
        self.version = 0
        self.write(first)
        self.file = ScenarioFile(path, stat=stat)
        self.now = 0.0
        self.backend = SimulatedBackend(self.file.node, clock=lambda: self.now, start=0.0,
                                        follow=self.file.poll)

    def write(self, content: dict[str, Any] | str, in_place: bool = False) -> None:
        text = content if isinstance(content, str) else yaml.safe_dump(content)
        target = self.path if in_place else self.path.with_suffix(".tmp")
        target.write_text(text)
        self.version += 1
        os.utime(target, ns=(self.version * 10**9, self.version * 10**9))
        if not in_place:
            target.replace(self.path)

    def sample(self) -> NodeSnapshot:
        return self.backend.sample()


def loads(snap: NodeSnapshot) -> dict[int, list[tuple[int, object]]]:
    """GPU index -> (pid, SM %) of each process on it."""
    return {g.index: [(p.pid, p.sm_util_percent) for p in g.processes] for g in snap.gpus}


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == LOGGER and r.levelno == logging.WARNING]


def test_a_process_written_into_the_file_shows_in_the_next_sample(tmp_path: Path) -> None:
    node = Node(tmp_path / "n1.yaml", doc(proc(0, 4000, 40)))
    assert loads(node.sample()) == {0: [(4000, 40.0)], 1: []}
    node.write(doc(proc(0, 4000, 40), proc(1, 4101, 63.5, memory=0.9, pod={
        "namespace": "llm", "name": "chat-abc", "container": "vllm"})))
    snap = node.sample()
    assert loads(snap) == {0: [(4000, 40.0)], 1: [(4101, 63.5)]}
    assert snap.gpus[1].utilization_percent == 63.5
    assert snap.gpus[1].processes[0].used_memory_bytes == int(0.9 * L4_MIB * MIB)
    assert node.backend.node.processes[1].pod is not None  # what attribution reads


def test_a_process_removed_from_the_file_disappears(tmp_path: Path) -> None:
    node = Node(tmp_path / "n1.yaml", doc(proc(0, 4000, 40), proc(1, 4101, 70)))
    assert node.sample().gpus[1].utilization_percent == 70.0
    node.write(doc(proc(0, 4000, 40)))
    snap = node.sample()
    assert loads(snap) == {0: [(4000, 40.0)], 1: []}
    assert snap.gpus[1].utilization_percent == 0.0
    assert snap.gpus[1].memory_used_bytes == 0


def test_a_load_change_is_followed_on_the_backends_clock(tmp_path: Path) -> None:
    node = Node(tmp_path / "n1.yaml", doc(proc(0, 4000, 40)))
    node.sample()
    node.write(doc(proc(0, 4000, 55)), in_place=True)  # same size: the new mtime tells
    assert loads(node.sample())[0] == [(4000, 55.0)]
    # A curve that arrives later is read at the scenario's time, not from its arrival.
    node.now = 150.0
    node.write(doc({"gpu": 0, "pid": 4000, "load": {"steps": [[0, 10], [100, 30]]}}))
    assert loads(node.sample())[0] == [(4000, 30.0)]


def test_an_unchanged_file_costs_one_stat_per_sample(tmp_path: Path) -> None:
    stats: list[Path] = []

    def counting(path: Path) -> os.stat_result:
        stats.append(path)
        return os.stat(path)

    node = Node(tmp_path / "n1.yaml", doc(proc(0, 4000, 40)), stat=counting)
    before = len(stats)
    first = node.file.node
    for _ in range(3):
        node.sample()
    assert len(stats) - before == 3
    assert node.file.node is first  # nothing was read again


@pytest.mark.parametrize(("bad", "problem"), [
    ("nodes: [{name: n1, gpus: [{model: L4, count: 2}]\n", "not valid YAML"),
    (yaml.safe_dump(doc(proc(0, 4000, 140))), "processes[0].load.constant: 140 is outside"),
    (yaml.safe_dump(doc(proc(2, 4000, 40))), "processes[0].gpu: GPU 2 does not exist"),
    (yaml.safe_dump({"nodes": [{"name": "other", "gpus": [{"model": "L4"}]}]}),
     "no node 'n1'"),
    ("#" * (4 * 1024 * 1024 + 1), "larger than 4194304 bytes"),
], ids=["not-yaml", "invalid", "no-such-gpu", "no-such-node", "oversized"])
def test_a_bad_rewrite_keeps_the_last_good_processes_and_says_so_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, bad: str, problem: str) -> None:
    node = Node(tmp_path / "n1.yaml", doc(proc(0, 4000, 40), proc(1, 4101, 60)))
    good = loads(node.sample())
    with caplog.at_level(logging.INFO, logger=LOGGER):
        node.write(bad)
        assert loads(node.sample()) == good
        assert loads(node.sample()) == good
        node.write(bad)  # the same problem written again: not said again
        assert loads(node.sample()) == good
        said = warnings(caplog)
        assert len(said) == 1
        assert problem in said[0]
        assert "keeping the last good scenario" in said[0]
        node.write(doc(proc(0, 4000, 45)))
        assert loads(node.sample()) == {0: [(4000, 45.0)], 1: []}
    assert f"scenario {node.path}: read again" in caplog.messages


def test_a_missing_file_keeps_the_last_good_processes_until_it_is_back(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    node = Node(tmp_path / "n1.yaml", doc(proc(0, 4000, 40)))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        node.path.unlink()
        for _ in range(3):
            assert loads(node.sample())[0] == [(4000, 40.0)]
        assert len(warnings(caplog)) == 1
        assert "cannot read (No such file or directory)" in warnings(caplog)[0]
        node.write(doc(proc(1, 4101, 20)))
        assert loads(node.sample()) == {0: [], 1: [(4101, 20.0)]}


def test_changed_gpus_are_refused_and_the_processes_that_fit_are_kept(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    node = Node(tmp_path / "n1.yaml", doc(proc(0, 4000, 40)))
    node.sample()
    four = [{"model": "H100-SXM5-80GB", "count": 4}]
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        node.write(doc(proc(0, 4000, 40), proc(1, 4101, 63.5), proc(3, 4103, 90), gpus=four))
        snap = node.sample()
        node.write(doc(proc(0, 4000, 50), proc(1, 4101, 63.5), proc(3, 4103, 90), gpus=four))
        again = node.sample()
    assert [g.name for g in snap.gpus] == ["NVIDIA L4", "NVIDIA L4"]  # the GPUs it started with
    assert loads(snap) == {0: [(4000, 40.0)], 1: [(4101, 63.5)]}
    assert loads(again)[0] == [(4000, 50.0)]
    # A memory fraction is of the GPU the process runs on: the L4 kept, not the H100 asked.
    assert snap.gpus[1].processes[0].used_memory_bytes == int(0.5 * L4_MIB * MIB)
    said = warnings(caplog)
    assert len(said) == 2  # once each, not again for the same change
    assert "the GPUs changed (2 GPUs -> 4; GPU 0 model L4 -> H100-SXM5-80GB; GPU 1 model " \
        "L4 -> H100-SXM5-80GB); keeping those it started with" in said[0]
    assert "left out 1 process(es) that do not fit its GPUs: " \
        "nodes[0].processes[2].gpu: GPU 3 does not exist (node has 2)" in said[1]


def test_a_changed_mig_layout_drops_the_processes_on_instances_it_lacks(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    def h100(*layout: str) -> list[dict[str, Any]]:
        return [{"model": "H100-SXM5-80GB", "sharing": "mig", "mig": list(layout)}]

    node = Node(tmp_path / "n1.yaml", doc(proc(0, 4000, 40, mig=0),
                                          gpus=h100("3g.40gb", "3g.40gb")))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        node.write(doc(proc(0, 4000, 40, mig=0), proc(0, 4002, 80, mig=2),
                       gpus=h100("3g.40gb", "2g.20gb", "1g.10gb")))
        snap = node.sample()
    assert [m.profile for m in snap.gpus[0].migs] == ["3g.40gb", "3g.40gb"]
    assert [[p.pid for p in m.processes] for m in snap.gpus[0].migs] == [[4000], []]
    said = warnings(caplog)
    assert "GPU 0 MIG ['3g.40gb', '3g.40gb'] -> ['3g.40gb', '2g.20gb', '1g.10gb']" in said[0]
    assert "processes[1].mig: GPU 0 has 2 MIG instances" in said[1]


def test_a_file_that_cannot_be_used_at_start_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="cannot read"):
        ScenarioFile(tmp_path / "absent.yaml")
