"""A progress bar for long work on a terminal (``simulate``, ``simulate --sweep``)."""

from __future__ import annotations

import sys
from collections.abc import Callable


def progress_bar(width: int = 30) -> Callable[[str, float], None] | None:
    """A one-line bar on stderr, redrawn in place, a newline when it reaches 100 %; None
    when stderr is no terminal (a log or a pipe gets no carriage returns)."""
    if not sys.stderr.isatty():
        return None

    def show(what: str, fraction: float) -> None:
        filled = int(width * fraction)
        end = "\n" if fraction >= 1.0 else ""
        sys.stderr.write(f"\r[{'#' * filled}{' ' * (width - filled)}] {fraction:4.0%} "
                         f"{what[:40]:<40}{end}")
        sys.stderr.flush()
    return show
