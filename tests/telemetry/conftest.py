"""Fixtures of the telemetry tests: the fake libnvidia-ml.so.1 built, a scenario file for
it, and processes that load it through the real nvidia-ml-py."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.peers.fakenvml import NvmlProcess, build


@pytest.fixture(scope="session")
def lib_dir() -> Path:
    return build()


@pytest.fixture(scope="session")
def old_lib_dir() -> Path:
    return build(old_driver=True)


@pytest.fixture
def scenario(tmp_path: Path) -> Callable[..., Path]:
    path = tmp_path / "scenario.txt"

    def write(*lines: str) -> Path:
        # Bump mtime explicitly: two writes within one timestamp tick must still reload.
        before = path.stat().st_mtime_ns if path.exists() else 0
        path.write_text("\n".join(lines) + "\n")
        st = path.stat()
        if st.st_mtime_ns <= before:
            import os

            os.utime(path, ns=(st.st_atime_ns, before + 1_000_000))
        return path

    return write


@pytest.fixture
def nvml(lib_dir: Path, scenario: Callable[..., Path]) -> Iterator[Callable[..., NvmlProcess]]:
    procs: list[NvmlProcess] = []

    def start(*lines: str, args: tuple[str, ...] = (), lib: Path | None = lib_dir) -> NvmlProcess:
        p = NvmlProcess(lib, scenario(*lines), *args)
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.close()
