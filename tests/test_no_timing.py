"""No test asserts a timing: a busy machine must not fail a right answer. Performance lives
in bench/ (figures in BENCHMARKS.md, beside a yardstick from the same run); tests assert
behaviour - orders, counts, bounds a count makes - and wait by polling for a state
(``tests.support.polling``), never inside a window of seconds.

This file is the one place the patterns it refuses are written, so it is not scanned."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, settings

from tests.support.repo import REPO

THIS = "test_no_timing.py"
_STOPWATCH = re.compile(r"\b(?:perf_counter|process_time|thread_time)(?:_ns)?\(")
_TIMED_ASSERT = re.compile(r"^\s*assert\b.*(?:monotonic|\btime|loop\.time)\(\)\s*-")


def timings(text: str) -> list[str]:
    """The lines of a test module that time something: "line N: what"."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        if _STOPWATCH.search(line):
            found.append(f"line {number}: a stopwatch")
        elif _TIMED_ASSERT.search(line):
            found.append(f"line {number}: an assertion on elapsed time")
    return found


def test_no_test_module_times_what_it_tests() -> None:
    modules = [p for p in (REPO / "tests").rglob("*.py") if p.name != THIS]
    assert len(modules) > 50  # the walk really holds the suite
    found = [f"{p.relative_to(REPO)} {t}" for p in modules for t in timings(p.read_text())]
    assert found == []


@pytest.mark.parametrize(("line", "caught"), [
    ("    start = time.process_time()", True),
    ("    t0 = time.perf_counter_ns()", True),
    ("    assert time.monotonic() - start < 1.0", True),
    ("    assert loop.time() - began <= 0.3", True),
    ("    assert time.monotonic() < deadline, seen  # a poll's bound", False),
    ("    await until(lambda: pushes.rounds > seen, within=10)", False),
])
def test_the_check_sees_a_timing(line: str, caught: bool) -> None:
    assert bool(timings(f"x = 1\n{line}\n")) is caught


def test_hypothesis_keeps_no_deadline() -> None:
    """Hypothesis times each example (200 ms by default) and fails a slow one; the suite's
    profile (conftest.py) turns that off, and its too-slow health check."""
    current = settings()  # what a @given test without its own settings runs with
    assert current.deadline is None
    assert HealthCheck.too_slow in current.suppress_health_check
