"""The repository stands alone: a clone reads nothing beside it. Tests, benches, docs and
scripts once read a sibling ``shared`` folder (schemas, the Azure trace) that a public
clone does not have; what they need now ships inside (``traces/``, ``tests/schemas/``, each
with a README naming its source and licence), and this keeps it so.

This file is the one place the patterns it refuses are written, so it is not scanned."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gpuscale.telemetry.scenario import parse_scenario
from tests.support.repo import REPO, SCHEMAS, TRACES
from tests.support.schemas import CRDS

THIS = Path(__file__).resolve().relative_to(REPO).as_posix()
_SIBLING = [  # text that names, or builds a path to, a folder beside the repository
    (re.compile(r"\.\.[/\\]+shared\b"), "a path into ../shared"),
    (re.compile(r"/work/shared\b"), "the shared folder's absolute path"),
    (re.compile(r"""["']shared["']\s*/|/\s*["']shared["']"""), "a path built to 'shared'"),
]
_PARENTS = re.compile(r"Path\(__file__\)(?:\.resolve\(\))?\.parents\[(\d+)\]")
_PARENT_CHAIN = re.compile(r"Path\(__file__\)(?:\.resolve\(\))?((?:\.parent(?!s))+)")
_SKIP_DIRS = {".git", ".venv", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache",
              ".hypothesis", ".cluster", ".site", "build", "dist"}


def leaks(rel: str, text: str) -> list[str]:
    """What in ``text`` (the file at ``rel``, relative to the repository root) reaches
    outside the repository: each as "line N: why"."""
    found = []
    depth = len(Path(rel).parts)  # parents[depth - 1] of the file is the repository root
    #                               (``depth`` times ``.parent``)
    for number, line in enumerate(text.splitlines(), 1):
        found += [f"line {number}: {why}" for pattern, why in _SIBLING if pattern.search(line)]
        if rel.endswith(".py"):
            ups = [int(m.group(1)) + 1 for m in _PARENTS.finditer(line)]
            ups += [m.group(1).count(".parent") for m in _PARENT_CHAIN.finditer(line)]
            found += [f"line {number}: {up} levels up from a file {depth} below the root"
                      for up in ups if up > depth]
    return found


def repository_files() -> Iterator[str]:
    """Every file a commit would hold: tracked, or new and not ignored (paths relative to
    the root). Without git (an unpacked archive), every file outside tool folders."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=REPO, capture_output=True,
                            check=False, timeout=60)
    if listed.returncode == 0:
        yield from (p for p in listed.stdout.decode().split("\0")
                    if p and (REPO / p).is_file())
        return
    for path in REPO.rglob("*"):
        rel = path.relative_to(REPO)
        if path.is_file() and not _SKIP_DIRS.intersection(rel.parts):
            yield rel.as_posix()


def test_no_file_reaches_beside_the_repository() -> None:
    found = []
    files = 0
    for rel in repository_files():
        if rel == THIS:
            continue
        try:
            text = (REPO / rel).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # images and other binaries
        files += 1
        found += [f"{rel} {leak}" for leak in leaks(rel, text)]
    assert files > 100  # the listing really holds the repository
    assert found == []


@pytest.mark.parametrize(("rel", "line", "caught"), [
    ("tests/sim/test_x.py", 'T = Path(__file__).resolve().parents[3] / "traces"', True),
    ("tests/sim/test_x.py", 'T = Path(__file__).resolve().parents[2] / "traces"', False),
    ("bench/b.py", "R = Path(__file__).resolve().parent.parent.parent", True),
    ("bench/b.py", "REPO = Path(__file__).resolve().parent.parent", False),
    ("bench/b.py", 'T = REPO.parent / "shared" / "traces"', True),
    ("docs/x.md", "`gpuscale simulate --trace " + ".." + "/shared/traces/t.csv`", True),
    ("dev", 'cat "$(dirname "$0")/' + ".." + '/shared/x"', True),
    ("docs/x.md", "see /work/" + "shared/schemas", True),
    ("docs/x.md", 'a GPU read "shared" for each pod', False),
    ("tests/x.py", 'assert split == "shared"', False),
])
def test_the_check_sees_a_path_beside_the_repository(rel: str, line: str,
                                                      caught: bool) -> None:
    assert bool(leaks(rel, f"x = 1\n{line}\n")) is caught


def test_every_shipped_data_file_is_named_in_its_readme_and_used() -> None:
    for folder in (SCHEMAS, TRACES):
        readme = (folder / "README.md").read_text()
        for path in folder.iterdir():
            if path.name != "README.md":
                assert f"{path.name} " in readme or f"## {path.name}" in readme, path
    used = {*CRDS.values(), "compose-spec.json"}
    assert {p.name for p in SCHEMAS.iterdir()} - {"README.md"} == used


def test_the_docs_trace_paths_are_files_in_the_repository() -> None:
    pages = [REPO / "README.md", *(REPO / "docs").glob("*.md")]
    named = {m.group(0) for page in pages
             for m in re.finditer(r"(?<![\w./-])traces/[\w.-]+", page.read_text())}
    assert "traces/azure-llm-inference-2023-conv.csv" in named
    assert [n for n in sorted(named) if not (REPO / n).is_file()] == []


def test_the_scenario_page_example_loads_from_the_repository_root() -> None:
    page = (REPO / "docs" / "scenarios.md").read_text()
    block = page[page.index("```yaml") + len("```yaml"):]
    scenario = parse_scenario(yaml.safe_load(block[:block.index("```")]), base_dir=REPO)
    assert scenario.nodes[0].processes[-1].load.at(600.0) > 0  # the trace's load, read
