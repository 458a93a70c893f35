"""A clock the test moves by hand (the ``clock`` fixture hands one out)."""

from __future__ import annotations


class Clock:
    """A monotonic clock a test moves by hand (``clock.now += 10``: the agents went quiet)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now
