"""Load scaling: a trace played at another rate and speed, looped, cut; and where its
sharpest rise is."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Literal

from gpuscale.traffic.trace import MAX_TRACE_ROWS, TraceRequest

RateMode = Literal["place", "rotate"]
RATE_MODES: tuple[RateMode, ...] = ("place", "rotate")
JITTER_S = 60.0  # "place": an added copy's request lands within +-30 s of the original's


def sharpest_rise(requests: Sequence[TraceRequest], window_s: float = 60.0) -> float | None:
    """Start of the window whose arrivals grew most over the window before it."""
    if not requests:
        return None
    counts: dict[int, int] = {}
    for r in requests:
        counts[int(r.arrival_s // window_s)] = counts.get(int(r.arrival_s // window_s), 0) + 1
    best = max(range(1, max(counts) + 1), default=None,
               key=lambda w: counts.get(w, 0) - counts.get(w - 1, 0))
    if best is None or counts.get(best, 0) <= counts.get(best - 1, 0):
        return None
    return best * window_s


def scale_trace(requests: Sequence[TraceRequest], rate: float, speedup: float,
                limit_s: float | None, loops: int = 1, mode: RateMode = "place",
                seed: int = 1) -> list[TraceRequest]:
    """``rate`` x the arrivals, time compressed by ``speedup``, played ``loops`` times back
    to back (each copy starts one trace span, plus the mean gap between arrivals, after the
    one before), cut at ``limit_s`` simulated seconds; sorted by arrival.

    More load superposes N = ceil(rate) copies of the trace; copy 0 is the trace itself.
    ``mode``:

    - ``"place"`` (the default): the load is scaled where it is. Each added copy's request
      arrives at its original's time plus a uniform draw within +-``JITTER_S``/2 (seeded
      by ``seed``; reflected back into the trace's span at its ends), so the load's shape
      over the day, the hour and the minute stays, and no two copies land on one instant
      (N prompts in the same millisecond would be a burst no real traffic has).
    - ``"rotate"``: copy k (k = 0 .. N-1) is the trace circularly shifted by k x P / N and
      wrapped into [0, P), where P is the period a loop repeats with (the span plus the
      mean gap). The mean rate is kept but not its shape: on a trace of several hours this
      rotates the day (copy 1 of a day-long trace puts its noon at midnight). What
      ``--rate`` did before, kept for the figures made with it.

    When ``rate`` is not whole, the last copy is thinned to its fractional part f: round(f
    x n) of its n requests are kept, chosen at random (seeded by ``seed``: the same seed
    gives the same requests; ``"rotate"`` keeps every 1/f-th, as it did); rate < 1 thins
    the trace itself. ValueError: a rate that is not positive and finite, or one that
    would make more than ``MAX_TRACE_ROWS`` requests (what a trace may hold). A trace whose
    requests all share one instant (span 0) cannot be spread; its copies coincide."""
    if loops < 1:
        raise ValueError(f"loops must be at least 1, not {loops}")
    if not 0 < rate < math.inf:
        raise ValueError(f"rate must be positive and finite, not {rate}")
    if rate * len(requests) > MAX_TRACE_ROWS:
        raise ValueError(f"rate {rate:g} x {len(requests)} requests is more than "
                         f"{MAX_TRACE_ROWS:,} requests; scale a shorter slice")
    if mode not in RATE_MODES:
        raise ValueError(f"rate mode must be one of {', '.join(RATE_MODES)}, not {mode!r}")
    if not requests:
        return []
    order = sorted(requests, key=lambda r: r.arrival_s)
    first = order[0].arrival_s
    span = order[-1].arrival_s - first
    period = span + (span / (len(order) - 1) if len(order) > 1 else 1.0)
    copies = math.ceil(rate)
    frac = round(rate - (copies - 1), 9)  # of the last copy: 1.0 when rate is whole
    rng = random.Random(seed)
    one: list[TraceRequest] = []  # one loop's worth, times from 0
    for k in range(copies):
        keep: Sequence[int] = range(len(order))
        if k == copies - 1 and frac < 1.0:
            keep = _thinned(len(order), frac, rng if mode == "place" else None)
        for j in keep:
            r = order[j]
            t = r.arrival_s - first
            if k and mode == "rotate":
                t += k * period / copies
                if t >= period:
                    t -= period
            elif k:
                t = _reflect(t + rng.uniform(-JITTER_S / 2, JITTER_S / 2), span)
            one.append(TraceRequest(t, r.input_tokens, r.output_tokens))
    one.sort(key=lambda r: r.arrival_s)
    out: list[TraceRequest] = []
    for loop in range(loops):
        for r in one:
            t = (r.arrival_s + loop * period) / speedup
            if limit_s is not None and t >= limit_s:
                return out
            out.append(TraceRequest(t, r.input_tokens, r.output_tokens))
    return out


def _thinned(n: int, frac: float, rng: random.Random | None) -> list[int]:
    """Which of ``n`` requests a copy thinned to ``frac`` keeps: round(frac x n) drawn by
    ``rng``; without one (``"rotate"``, as it always did), the j-th when floor((j + 1) x
    frac) > floor(j x frac)."""
    if rng is not None:
        return sorted(rng.sample(range(n), round(frac * n)))
    return [j for j in range(n) if math.floor((j + 1) * frac) > math.floor(j * frac)]


def _reflect(t: float, span: float) -> float:
    """``t`` folded back into [0, span] at either end (a jitter never leaves the trace)."""
    if span <= 0:
        return 0.0
    if t < 0:
        t = -t
    if t > span:
        t = 2 * span - t
    return min(span, max(0.0, t))
