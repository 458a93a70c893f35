"""Every Python module the repository tracks stays short enough to read in one sitting: at
most ``MAX_MODULE_LINES`` lines, and each function (or method) at most
``MAX_FUNCTION_LINES`` lines, counted from its ``def`` line to its last line
(``end_lineno - lineno + 1``; decorators above the ``def`` are not counted). Generated code
(the protobuf and gRPC modules under src/gpuscale/proto, produced by
``python -m gpuscale.proto.generate``) is not held to it. No allow-list: a module that grows
past a limit is split by what it does (STYLE.md)."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_MODULE_LINES = 420
MAX_FUNCTION_LINES = 100
# What the tree walk (no git) passes over: environments, caches, build output.
SKIPPED_DIRS = frozenset({".venv", "venv", ".git", "build", "dist", "node_modules",
                          "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache",
                          ".hypothesis", ".import_linter_cache", ".tox"})


def generated(path: str) -> bool:
    """Code a generator writes (``*_pb2.py``, ``*_pb2_grpc.py``), not a person."""
    name = path.rsplit("/", 1)[-1]
    return name.endswith(("_pb2.py", "_pb2_grpc.py"))


def tracked_python() -> list[str]:
    """Repository-relative paths of the Python files to measure: what git tracks, or,
    outside a git checkout (an unpacked archive), every .py file but those in
    ``SKIPPED_DIRS`` and egg-info folders."""
    git = shutil.which("git")
    if git is not None and (ROOT / ".git").exists():
        listed = subprocess.run([git, "ls-files", "-z", "--", "*.py"], cwd=ROOT,
                                capture_output=True, check=True).stdout.decode()
        return [p for p in listed.split("\0") if p and (ROOT / p).is_file()]
    found = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS and not d.endswith(".egg-info")]
        found += [str((Path(folder) / f).relative_to(ROOT)) for f in files if f.endswith(".py")]
    return sorted(found)


def offences(path: str, source: str) -> Iterator[str]:
    """``path: N lines`` for a module over the limit, ``path:function N lines`` for each
    function over it (methods named Class.method, nested functions outer.inner)."""
    lines = len(source.splitlines())
    if lines > MAX_MODULE_LINES:
        yield f"{path}: {lines} lines (module, at most {MAX_MODULE_LINES})"

    def walk(node: ast.AST, prefix: str) -> Iterator[str]:
        for child in ast.iter_child_nodes(node):
            name = prefix
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                length = (child.end_lineno or child.lineno) - child.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    yield (f"{path}:{name} {length} lines "
                           f"(function, at most {MAX_FUNCTION_LINES})")
                name += "."
            elif isinstance(child, ast.ClassDef):
                name = f"{prefix}{child.name}."
            yield from walk(child, name)

    yield from walk(ast.parse(source, filename=path), "")


def test_offences_are_found() -> None:
    """The measure itself: a long function, a nested one and a long module are named."""
    body = "".join(f"        x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    source = (f"class C:\n    def ok(self) -> None:\n        pass\n\n"
              f"    def long(self) -> None:\n{body}\n"
              f"def outer() -> None:\n    def inner() -> None:\n{body}")
    found = list(offences("m.py", source + "\n" * MAX_MODULE_LINES))
    assert [f.split(" ")[0] for f in found] == ["m.py:", "m.py:C.long", "m.py:outer",
                                               "m.py:outer.inner"]
    assert list(offences("m.py", "def f() -> None:\n    pass\n")) == []
    assert generated("src/gpuscale/proto/telemetry_pb2_grpc.py")
    assert not generated("src/gpuscale/proto/generate.py")


def test_no_module_or_function_is_over_the_limits() -> None:
    paths = [p for p in tracked_python() if not generated(p)]
    assert len(paths) > 100, f"only {len(paths)} Python files found under {ROOT}"
    found = [o for p in paths
             for o in offences(p, (ROOT / p).read_text(encoding="utf-8"))]
    assert not found, ("over the size limits (split by what the code does, STYLE.md):\n"
                       + "\n".join(found))
