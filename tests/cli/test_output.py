"""How the commands end and refuse, as a user meets it: a reader that goes away (``| head``),
a flag the subcommand does not know, and an output file that cannot be written - refused
before the work, not after it. Real processes, real pipes."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import cast

import grpc
import pytest

from gpuscale.cli import BROKEN_PIPE_EXIT, main
from gpuscale.common import plotting
from gpuscale.common.errors import ConfigError
from gpuscale.common.plotting import PlotUnavailable, check_plot
from gpuscale.proto import externalscaler_pb2 as kpb
from gpuscale.proto import externalscaler_pb2_grpc as kpb_grpc
from tests.support.processes import Served

GPUSCALE = [sys.executable, "-m", "gpuscale.cli"]
ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "deploy" / "examples" / "vllm.yaml"


def closed_pipe(*args: str) -> subprocess.CompletedProcess[str]:
    """The command with its stdout a pipe whose reader is gone before it writes a byte
    (``gpuscale ... | head`` once head has exited): every write fails, deterministically."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([*GPUSCALE, *args], stdout=write, stderr=subprocess.PIPE,
                              text=True, timeout=120, check=False, cwd=ROOT)
    finally:
        os.close(write)


@pytest.mark.parametrize("args", [
    ["profiles"],
    ["gpus", "--gpu-backend", "sim", "--json"],
    ["gpus", "--gpu-backend", "sim", "--scenario", "mig-node"],
    ["generate", str(MANIFEST)],
    ["simulate", "--pattern", "steps", "--duration", "120", "--policies", "planner"],
    # Its first line fails while the other agents and the scaler are still starting: each
    # gRPC server (agent streams, KEDA's port) is stopped even when cancelled in its start.
    ["demo", "--scenario", "h100-vllm", "--port", "0", "--metrics-port", "0"],
])
def test_a_reader_that_goes_away_ends_the_command_quietly(args: list[str]) -> None:
    got = closed_pipe(*args)
    assert got.returncode == BROKEN_PIPE_EXIT, got.stderr
    assert got.stderr == ""  # no traceback, no "Exception ignored"


def keda_asks(address: str, name: str) -> None:
    with grpc.insecure_channel(address) as ch:
        kpb_grpc.ExternalScalerStub(ch).GetMetricSpec(kpb.ScaledObjectRef(
            namespace="llm", name=name, scalerMetadata={"podSelector": "app=triton-embed",
                                                        "profile": "gpu-utilization"}),
            timeout=5)


@pytest.fixture(scope="module")
def asked(scenario_scaler: Served) -> str:
    keda_asks(scenario_scaler.address, "embed")
    return scenario_scaler.address


@pytest.mark.slow
@pytest.mark.parametrize("args", [
    ["explain", "llm/embed", "--json"],
    ["explain", "llm/embed"],
    ["top", "--once"],
    ["top", "--json"],
    ["idle", "--format", "csv"],
])
def test_the_operator_tools_end_quietly_too(asked: str, args: list[str]) -> None:
    got = closed_pipe(*args, "--scaler", asked)
    assert got.returncode == BROKEN_PIPE_EXIT, got.stderr
    # What the command says on stderr is its own (idle: no history yet), never the pipe's.
    for noise in ("Traceback", "Exception ignored", "BrokenPipe", "Broken pipe"):
        assert noise not in got.stderr


@pytest.mark.parametrize(("argv", "usage"), [
    (["generate", "x", "--bogus"], "usage: gpuscale generate "),
    (["demo", "--bogus"], "usage: gpuscale demo "),  # what ./dev run --bogus runs
    (["explain", "llm/x", "--bogus", "1"], "usage: gpuscale explain "),
    (["--bogus", "profiles"], "usage: gpuscale [-h]"),  # before the subcommand: the top's
])
def test_a_wrong_flag_shows_the_usage_of_the_command_it_follows(
        argv: list[str], usage: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(usage), err
    assert "unrecognized arguments: --bogus" in err


def test_dev_run_passes_a_wrong_flag_to_the_demos_usage() -> None:
    """``./dev run`` execs ``gpuscale demo`` with its arguments (once the venv is set up,
    which this checkout's is)."""
    if not (ROOT / ".venv" / ".gpuscale-installed").exists():
        pytest.skip("./dev run would install the venv first")
    got = subprocess.run([str(ROOT / "dev"), "run", "--bogus"], capture_output=True,
                         text=True, timeout=60, check=False, cwd=ROOT)
    assert got.returncode == 2
    assert got.stderr.startswith("usage: gpuscale demo "), got.stderr[:300]


# -- an output file: checked before the work -------------------------------------------------


@pytest.mark.parametrize(("name", "words"), [
    ("missing/x.png", "does not exist"),
    ("x.pnk", "does not write .pnk"),
    ("folder", "that is a folder"),
])
def test_a_plot_that_cannot_be_written_is_refused(tmp_path: Path, name: str,
                                                  words: str) -> None:
    (tmp_path / "folder").mkdir()
    with pytest.raises(ConfigError, match=words):
        check_plot(tmp_path / name)


def test_plot_names_it_accepts(tmp_path: Path) -> None:
    for name in ("sim.png", "sim.SVG", "sim.pdf", "sim"):  # no suffix: matplotlib's PNG
        check_plot(tmp_path / name)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_a_read_only_folder_is_refused(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with pytest.raises(ConfigError, match="cannot be written"):
            check_plot(ro / "x.png")
    finally:
        ro.chmod(0o755)


def test_without_matplotlib_the_hint_fits_the_install(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib: ImportError
    with pytest.raises(PlotUnavailable) as err:
        plotting.load_pyplot()
    # This checkout is installed editable (./dev): the hint names its folder and -e.
    assert f"pip install -e '{ROOT}[plot]'" in str(err.value)


def test_the_sweeps_plot_gives_the_same_hint(monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    from gpuscale.sim.sweep import Sweep
    from gpuscale.sim.sweep_plot import plot_sweep

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(PlotUnavailable) as err:
        plot_sweep(cast(Sweep, None), tmp_path / "x.png")  # refused before reading it
    assert f"pip install -e '{ROOT}[plot]'" in str(err.value)


def test_the_hint_for_an_install_from_the_index(monkeypatch: pytest.MonkeyPatch) -> None:
    class Dist:
        def read_text(self, name: str) -> str | None:
            return None  # no direct_url.json: installed from an index

    monkeypatch.setattr(metadata, "distribution", lambda _name: Dist())
    hint = plotting.install_hint()
    assert hint.startswith("pip install 'gpuscale[plot]'")
    assert "-e '.[plot]'" in hint  # and from a checkout


@pytest.mark.parametrize("args", [
    ["simulate", "--pattern", "diurnal", "--plot", "/nonexistent/dir/x.png"],
    ["simulate", "--pattern", "diurnal", "--plot", "sim.pnk"],
    # No scaler listens on port 1: a refusal after the report would say so instead.
    ["idle", "--scaler", "127.0.0.1:1", "--plot", "/nonexistent/dir/x.png"],
])
def test_the_commands_refuse_an_unwritable_plot_before_the_work(args: list[str]) -> None:
    got = subprocess.run([*GPUSCALE, *args], capture_output=True, text=True, timeout=120,
                         check=False, cwd=ROOT)
    assert got.returncode == 2, got.stderr
    assert got.stdout == ""  # no report printed first
    assert got.stderr.startswith("gpuscale: --plot "), got.stderr
    assert "did not answer" not in got.stderr


def test_simulate_refuses_before_the_work_without_matplotlib(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    from gpuscale.sim import compare

    def never(*_: object, **__: object) -> None:
        raise AssertionError("simulated before refusing")

    monkeypatch.setattr(compare, "compare", never)
    assert main(["simulate", "--pattern", "diurnal", "--plot", "sim.png"]) == 2
    assert "--plot needs matplotlib: pip install" in capsys.readouterr().err
