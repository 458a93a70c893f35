"""Synthetic request streams for load shapes a trace does not cover.

Every pattern is seeded and deterministic: the same (pattern, duration, rate, seed) gives
the same requests. Arrivals are a Poisson process whose rate follows the shape, drawn by
thinning (candidates at the shape's peak rate, each kept with probability rate(t)/peak),
so a burst starts when the shape says, not after the gap drawn before it.

Shapes, with ``rate`` in requests/s and D the duration:

- ``diurnal``: one slow day-night cycle, 20-100 % of rate (lowest at 0 and D).
- ``bursts``: rate/4, with three 2-minute bursts at 2 x rate (from 20, 50 and 80 % of D).
- ``idle-night``: rate for the first half, nothing after.
- ``idle-gap``: rate for the first 30 % of D, nothing until 70 %, rate again after: a
  workload that goes to zero replicas (``--min-replicas 0``) and must come back on demand.
- ``steps``: five equal stretches at 25, 50, 100, 50 and 25 % of rate (steps up, then down).
- ``ramp``: linear from 10 % of rate to rate at D/2, then linearly back to 10 %.
- ``burst10``: rate/10, and from 40 % of D a sudden burst of 10 x that (rate) for
  3 minutes (D/10 when shorter).
- ``short-bursty``: short requests (prompt ~170, output ~45 tokens) in 10 s bursts at rate
  every minute, 5 % of rate between them.
- ``long-prompts``: multi-turn sessions (2-6 turns, 10-60 s apart) whose prompts start at
  4,000-6,000 tokens and grow by each turn's output and a new message, capped at 8,192;
  sessions start so that requests average ``rate``/s.
- ``long-prompt-bursts``: rate/3 of ordinary requests throughout, and six 90-s bursts, at
  seeded random times, of rate/4 more whose prompts are 8,000-16,000 tokens (prefill, not
  the request count, is what a burst adds: a burst the count of requests hides).
- ``reasoning``: the diurnal cycle at rate/20 requests/s, each generating ~6,000 tokens
  (log-normal, 24 times the usual output): requests that run for minutes, longer than a
  pod's 30-s termination grace, so a scale-down cuts them and KV cache, not compute, is
  what fills.
- ``noisy-diurnal``: the diurnal cycle times a noise factor drawn every 30 s (log-normal,
  sigma 0.35, at most 2): a slow shape under fast wandering, where a forecast must not
  chase the noise.

Token counts elsewhere are log-normal: prompt ~1,000 and output ~250 tokens on average.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from gpuscale.traffic.trace import TraceRequest

PATTERNS = ("diurnal", "bursts", "idle-night", "idle-gap", "steps", "ramp", "burst10",
            "short-bursty", "long-prompts", "long-prompt-bursts", "noisy-diurnal", "reasoning")

Shape = Callable[[float], float]  # t -> requests/s as a multiple of ``rate``


def _shapes(duration: float) -> dict[str, tuple[Shape, float]]:
    """Each pattern's shape and its peak (multiples of rate)."""
    d = duration
    bursts = [d * f for f in (0.2, 0.5, 0.8)]
    burst10_at, burst10_len = 0.4 * d, min(180.0, d / 10)
    levels = (0.25, 0.5, 1.0, 0.5, 0.25)
    return {
        "diurnal": (lambda t: 0.2 + 0.8 * (1 - math.cos(2 * math.pi * t / d)) / 2, 1.0),
        "bursts": (lambda t: 2.0 if any(b <= t < b + 120 for b in bursts) else 0.25, 2.0),
        "idle-night": (lambda t: 1.0 if t < d / 2 else 0.0, 1.0),
        "idle-gap": (lambda t: 0.0 if 0.3 * d <= t < 0.7 * d else 1.0, 1.0),
        "steps": (lambda t: levels[min(len(levels) - 1, int(t / d * len(levels)))], 1.0),
        "ramp": (lambda t: 0.1 + 0.9 * (1 - abs(2 * t / d - 1)), 1.0),
        "burst10": (lambda t: 1.0 if burst10_at <= t < burst10_at + burst10_len else 0.1,
                    1.0),
        "short-bursty": (lambda t: 1.0 if t % 60.0 < 10.0 else 0.05, 1.0),
    }


def shape_of(pattern: str, duration: float) -> tuple[Shape, float]:
    """A shaped pattern's rate over time (multiples of rate) and its peak; ValueError for
    the patterns that are not one shape (``long-prompts``, ``long-prompt-bursts``,
    ``noisy-diurnal``, ``reasoning``)."""
    shapes = _shapes(duration)
    if pattern not in shapes:
        raise ValueError(f"pattern {pattern!r} is not a shaped pattern (those are: "
                         f"{', '.join(shapes)})")
    return shapes[pattern]


def synthetic(pattern: str, duration: float, rate: float, seed: int = 1) -> list[TraceRequest]:
    """Requests for the named load shape (see the module's docstring), sorted by arrival.
    ValueError for an unknown pattern."""
    if pattern not in PATTERNS:
        raise ValueError(f"pattern {pattern!r} is not one of {', '.join(PATTERNS)}")
    rng = random.Random(seed)
    if pattern == "long-prompts":
        return _sessions(rng, duration, rate)
    if pattern == "long-prompt-bursts":
        return _long_prompt_bursts(rng, duration, rate)
    if pattern == "noisy-diurnal":
        shape, peak = _noisy_diurnal(rng, duration)
    elif pattern == "reasoning":
        shape, peak = shape_of("diurnal", duration)
        rate = rate / 20
    else:
        shape, peak = shape_of(pattern, duration)
    short = pattern == "short-bursty"
    long_outputs = 24 if pattern == "reasoning" else 1
    out: list[TraceRequest] = []
    t = 0.0
    while True:
        t += rng.expovariate(rate * peak)
        if t >= duration:
            return out
        if rng.random() * peak < shape(t):
            if short:
                out.append(TraceRequest(t, int(rng.lognormvariate(5.0, 0.5)),
                                        max(1, int(rng.lognormvariate(3.7, 0.5)))))
            else:
                out.append(TraceRequest(t, int(rng.lognormvariate(6.7, 0.6)),
                                        long_outputs * int(rng.lognormvariate(5.3, 0.6))))


def _sessions(rng: random.Random, duration: float, rate: float) -> list[TraceRequest]:
    out: list[TraceRequest] = []
    t = 0.0
    mean_turns = 4.0  # turns are uniform in 2..6
    while True:
        t += rng.expovariate(rate / mean_turns)
        if t >= duration:
            break
        at, prompt = t, rng.randint(4_000, 6_000)
        for _ in range(rng.randint(2, 6)):
            if at >= duration:
                break
            output = int(rng.lognormvariate(5.3, 0.6))
            out.append(TraceRequest(at, prompt, output))
            prompt = min(8_192, prompt + output + int(rng.lognormvariate(5.0, 0.7)))
            at += rng.uniform(10.0, 60.0)
    out.sort(key=lambda r: r.arrival_s)
    return out


def _noisy_diurnal(rng: random.Random, duration: float) -> tuple[Shape, float]:
    noise = [min(2.0, rng.lognormvariate(0.0, 0.35))
             for _ in range(int(duration // 30) + 1)]

    def shape(t: float) -> float:
        day = 0.2 + 0.8 * (1 - math.cos(2 * math.pi * t / duration)) / 2
        return 0.5 * day * noise[int(t // 30)]
    return shape, 1.0


def _long_prompt_bursts(rng: random.Random, duration: float,
                        rate: float) -> list[TraceRequest]:
    out: list[TraceRequest] = []
    t = 0.0
    while True:  # the ordinary requests
        t += rng.expovariate(rate / 3)
        if t >= duration:
            break
        out.append(TraceRequest(t, int(rng.lognormvariate(6.7, 0.6)),
                                int(rng.lognormvariate(5.3, 0.6))))
    for _ in range(6):
        start = rng.uniform(0.0, max(0.0, duration - 90.0))
        t = start
        while True:
            t += rng.expovariate(rate / 4)
            if t >= min(duration, start + 90.0):
                break
            out.append(TraceRequest(t, rng.randint(8_000, 16_000),
                                    int(rng.lognormvariate(5.3, 0.6))))
    out.sort(key=lambda r: r.arrival_s)
    return out
