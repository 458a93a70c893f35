"""Load scaling: a trace played at another rate and speed, looped, cut; and where its
sharpest rise is."""

from __future__ import annotations

import math
from collections.abc import Sequence

from gpuscale.traffic.trace import TraceRequest


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
                limit_s: float | None, loops: int = 1) -> list[TraceRequest]:
    """``rate`` x the arrivals, time compressed by ``speedup``, played ``loops`` times back
    to back (each copy starts one trace span, plus the mean gap between arrivals, after the
    one before), cut at ``limit_s`` simulated seconds; sorted by arrival.

    More load superposes shifted copies of the trace: with N = ceil(rate) copies, copy k
    (k = 0 .. N-1) is the trace circularly shifted by k x P / N and wrapped into [0, P),
    where P is the period a loop repeats with (the span plus the mean gap; wrapping at
    the span itself would land the first and last requests on one instant). Copy 0 is the
    trace itself. When ``rate`` is not whole, the last copy is
    thinned to its fractional part, deterministically: of its requests, in trace order,
    the j-th is kept when floor((j + 1) x f) > floor(j x f). (rate < 1 thins the trace
    itself that way.) Repeating each request ``rate`` times at the same instant instead
    would be a burst no real traffic has: N prompts landing in the same millisecond. A
    trace whose requests all share one instant (span 0) cannot be shifted; its copies
    coincide."""
    if loops < 1:
        raise ValueError(f"loops must be at least 1, not {loops}")
    if not rate > 0:
        raise ValueError(f"rate must be positive, not {rate}")
    if not requests:
        return []
    order = sorted(requests, key=lambda r: r.arrival_s)
    first = order[0].arrival_s
    span = order[-1].arrival_s - first
    period = span + (span / (len(order) - 1) if len(order) > 1 else 1.0)
    copies = math.ceil(rate)
    frac = round(rate - (copies - 1), 9)  # of the last copy: 1.0 when rate is whole
    one: list[TraceRequest] = []  # one loop's worth, times from 0
    for k in range(copies):
        shift = k * period / copies
        thin = k == copies - 1 and frac < 1.0
        for j, r in enumerate(order):
            if thin and math.floor((j + 1) * frac) <= math.floor(j * frac):
                continue
            t = r.arrival_s - first + shift
            if t >= period:
                t -= period
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

