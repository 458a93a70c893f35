"""``gpuscale generate`` as a person runs it: one autoscaler per output (the ScaledObject,
or with ``--hpa`` the plain HPA, never both: ``kubectl apply -f -`` of both makes two HPAs
fight over the workload), and one line naming the file (and the line and column) for a
manifest it cannot read."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpuscale.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "deploy" / "examples"
VLLM = str(EXAMPLES / "vllm.yaml")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["generate", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_command_writes_one_autoscaler() -> None:
    for flags, kind in (([], "ScaledObject"), (["--hpa"], "HorizontalPodAutoscaler")):
        done = subprocess.run([sys.executable, "-m", "gpuscale.cli", "generate", VLLM,
                               "--startup-seconds", "240", *flags],
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        assert [d["kind"] for d in yaml.safe_load_all(done.stdout)] == [kind]
        assert done.stdout.startswith("# engine: vllm")


def test_the_hpa_says_what_it_is_and_leaves_out_kedas_notes(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, so, _ = run(capsys, VLLM)
    assert code == 0
    assert "# fallback:" in so
    code, hpa, _ = run(capsys, VLLM, "--hpa")
    assert code == 0
    assert "fallback" not in hpa
    assert "ScaledObject\n" not in hpa.replace("# ", "")
    assert "# a plain HPA on gpuscale's custom metrics API, for clusters without KEDA" in hpa
    notes = [line for line in hpa.splitlines() if line.startswith("#")]
    assert notes[:-1] == [line for line in so.splitlines()
                          if line.startswith("#") and "fallback" not in line]


def test_an_option_only_the_scaled_object_uses_is_refused_with_hpa(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, VLLM, "--hpa", "--keda-version", "2.16")
    assert (code, out) == (2, "")
    assert err == ("gpuscale: --keda-version: with --hpa there is no ScaledObject for it; "
                   "drop one of them\n")
    code, out, _ = run(capsys, VLLM, "--keda-version", "2.16")
    assert code == 0
    assert "fallback: none - before KEDA 2.17" in out
    # The scaler's address is the ScaledObject's too: an HPA reads the metrics API.
    code, out, err = run(capsys, VLLM, "--hpa", "--scaler-address", "s.ns.svc:6000")
    assert (code, out) == (2, "")
    assert err.startswith("gpuscale: --scaler-address: with --hpa there is no ScaledObject")
    code, out, _ = run(capsys, VLLM, "--scaler-address", "s.ns.svc:6000")
    assert code == 0
    assert "scalerAddress: s.ns.svc:6000" in out
    code, out, _ = run(capsys, VLLM)
    assert "scalerAddress: gpuscale-scaler.gpuscale.svc:6000" in out


@pytest.mark.parametrize(("head", "says"), [
    ("kind: Deployment\n", "apiVersion: missing; a Deployment needs apiVersion: apps/v1"),
    ("apiVersion: extensions/v1beta1\nkind: StatefulSet\n",
     "apiVersion: 'extensions/v1beta1'; a StatefulSet is apps/v1"),
    ("apiVersion: apps/v1\nkind: Deployment\nmetadata: {}\n", "metadata.name: required"),
])
def test_a_workload_it_cannot_use_names_the_file_and_the_field(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, head: str, says: str) -> None:
    path = tmp_path / "llm.yaml"
    path.write_text(head)
    code, out, err = run(capsys, str(path))
    assert (code, out) == (2, "")
    assert err.startswith(f"gpuscale: {path}: {says}")
    assert err.count("\n") == 1
    assert "None" not in err


@pytest.mark.parametrize(("text", "says"), [
    ("kind: Deployment\nmetadata:\n  labels: [a\n  b: c\n",
     ":4:4: not YAML: expected ',' or ']', but got ':' (while parsing a flow sequence at "
     "3:11)"),
    ("kind: [unclosed", ":1:16: not YAML: expected ',' or ']', but got '<stream end>'"),
    ("a: b\n\tc: d\n", ":2:1: not YAML: found character '\\t' that cannot start any token"),
    ("a: &x b\nc: *y\n", ":2:4: not YAML: found undefined alias 'y'"),
    ("a: b\nc: d\x00\n", ":2:5: not YAML: unacceptable character #x0000: special "
                         "characters are not allowed"),
    ("--- !!python/object/apply:os.system ['true']\n",
     ":1:5: not YAML: could not determine a constructor for the tag"),
    ("[" * 100_000, ": not YAML that can be read: nested too deeply"),
    ("a: '" + "\u202e" * 50 + "\n\n" + "x" * 5000, ":3:5001: not YAML: found unexpected "
     "end of stream (while scanning a quoted scalar at 1:4)"),
    ("a: *" + "y" * 5000, ":1:4: not YAML: found undefined alias 'yyy"),  # cut short
])
def test_malformed_yaml_is_one_line_with_the_file_line_and_column(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    code, out, err = run(capsys, str(path))
    assert (code, out) == (2, "")
    assert err.startswith(f"gpuscale: {path}{says}")
    assert err.count("\n") == 1
    assert len(err) < 400
    assert "<unicode string>" not in err
    assert "Traceback" not in err


def test_standard_input_and_oversized_files_are_named_too(
        capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import io
    monkeypatch.setattr(sys, "stdin", io.StringIO("a: [b\n"))
    code, _, err = run(capsys, "-")
    assert code == 2
    assert err.startswith("gpuscale: -:2:1: not YAML: ")
    big = tmp_path / "big.yaml"
    big.write_text("#" * (1024 * 1024 + 1))
    code, _, err = run(capsys, str(big))
    assert (code, err) == (2, f"gpuscale: {big}: larger than 1048576 bytes\n")
