"""A simulated replica's cold start (``models.serving``): image pull, weights load, CUDA
graph capture - 80-300 s by default, most starts short and a long tail (a node pulling the
image).

Each replica draws its own: lo + (hi - lo) x u^a with u uniform in [0, 1) seeded by
``cold_start_seed`` and a draw number, and a chosen so that the mean is ``cold_start_s``.
The draw number is the replica's creation number by default. With ``cold_start_slot_s``
> 0 it is the moment instead: a replica created in the slot t // slot draws as the k-th
replica created in that slot - the start-up weather of a cluster, so that two runs (two
settings of a knob, two planners) that create a replica in the same slot meet the same
start-up however many replicas each created before, and compare pair by pair.
"""

from __future__ import annotations

import math
import random

SLOT_DRAWS = 1 << 16  # cold_start_slot_s: the draw numbers of one slot (slot x this + k)


def draw(spread: tuple[float, float], mean: float, seed: int, number: int) -> float:
    """Draw ``number``'s cold start, seconds: deterministic per seed and number. A ``mean``
    outside the open interval ``spread`` (0 in a test, or lo == hi) is every draw."""
    lo, hi = spread
    if not lo < mean < hi:
        return mean
    a = (hi - lo) / (mean - lo) - 1.0  # E[u^a] = 1/(a+1)
    u = random.Random(seed * 1_000_003 + number).random()
    return lo + (hi - lo) * float(u**a)


class Slots:
    """One simulation's draw numbers by slot: the slot last created in, and how many."""

    def __init__(self, slot_s: float) -> None:
        self.slot_s = slot_s
        self._slot, self._count = -1, 0

    def number(self, now: float, created: int) -> int:
        """The draw number of a replica created at ``now``, the ``created``-th in the run:
        ``created`` itself without slots."""
        if self.slot_s <= 0:
            return created
        slot = math.floor(now / self.slot_s)
        k = self._count if slot == self._slot else 0
        self._slot, self._count = slot, k + 1
        return slot * SLOT_DRAWS + k
