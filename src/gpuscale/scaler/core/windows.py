"""Per-second history for the planner (``scaler.core.planner``): windows of the newest
values with running sums, so that a sum over the last n seconds and a least-squares slope
cost O(1) however long the window."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

REBASE_AFTER = 1 << 16  # values pushed before a window's running sums are recomputed
BASE_BLOCK_S = 60  # a whole minute of history: the blocks the levels are made of


@dataclass(slots=True)
class Window:
    """Per-second values over a bounded span, with prefix sums for interval sums and, with
    ``slopes``, least-squares slopes (a third deque: only the windows that need them)."""

    span: int
    slopes: bool = False
    values: deque[float] = field(default_factory=deque)
    prefix: deque[float] = field(default_factory=lambda: deque([0.0]))
    moments: deque[float] = field(default_factory=lambda: deque([0.0]))  # of k x value
    count: int = 0  # values ever pushed (the index k of the next one)

    def push(self, value: float) -> None:
        if self.count >= REBASE_AFTER:  # keep the sums small: float64 stays exact enough
            self._rebase()
        self._append(value)
        while len(self.values) > self.span:
            self.values.popleft()
            self.prefix.popleft()
            if self.slopes:
                self.moments.popleft()

    def _append(self, value: float) -> None:
        self.values.append(value)
        self.prefix.append(self.prefix[-1] + value)
        if self.slopes:
            self.moments.append(self.moments[-1] + self.count * value)
        self.count += 1

    def _rebase(self) -> None:
        """Recompute the running sums from the values held, indexed from 0: the sums
        otherwise grow with the process's age (k x value after a year at 1 Hz is ~1e10 per
        term), and the slope's difference of two such sums would lose its digits."""
        values = list(self.values)
        self.clear()
        for value in values:
            self._append(value)

    def last(self, n: int) -> float:
        """The sum of the last ``n`` values (fewer if fewer are held)."""
        n = min(n, len(self.values))
        return self.prefix[-1] - self.prefix[-1 - n]

    def slope(self, n: int) -> float:
        """Least-squares slope of the last ``n`` values per step (0 with fewer than 2)."""
        assert self.slopes, "a window kept without slopes"
        n = min(n, len(self.values))
        if n < 2:
            return 0.0
        total = self.last(n)
        weighted = self.moments[-1] - self.moments[-1 - n]
        mean_k = self.count - (n + 1) / 2  # mean index of the last n
        return (weighted - mean_k * total) / (n * (n * n - 1) / 12)

    def clear(self) -> None:
        self.values.clear()
        self.prefix.clear()
        self.prefix.append(0.0)
        self.moments.clear()
        self.moments.append(0.0)
        self.count = 0
