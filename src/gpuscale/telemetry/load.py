"""Load curves for simulated processes: SM duty cycle (0-100 %) as a function of time.

Every curve is a pure function of scenario time in seconds, so the same scenario at the same
time gives the same reading - the tests and the demo rely on that.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from gpuscale.traffic.trace import TraceRequest


class LoadCurve(Protocol):
    def at(self, t: float) -> float:
        """SM duty cycle in percent at scenario time ``t`` (seconds), within 0-100."""
        ...


def _clamp(v: float) -> float:
    return min(100.0, max(0.0, v))


@dataclass(frozen=True, slots=True)
class Constant:
    value: float

    def at(self, t: float) -> float:
        return _clamp(self.value)


@dataclass(frozen=True, slots=True)
class Sine:
    base: float
    amplitude: float
    period_s: float
    phase_s: float = 0.0

    def at(self, t: float) -> float:
        angle = 2 * math.pi * (t + self.phase_s) / self.period_s
        return _clamp(self.base + self.amplitude * math.sin(angle))


@dataclass(frozen=True, slots=True)
class Steps:
    """Piecewise constant: ``values[i]`` from ``starts[i]`` on; repeats every ``repeat_s``."""

    starts: tuple[float, ...]
    values: tuple[float, ...]
    repeat_s: float | None = None

    def at(self, t: float) -> float:
        if self.repeat_s:
            t = t % self.repeat_s
        i = bisect.bisect_right(self.starts, t) - 1
        return _clamp(self.values[max(i, 0)])


@dataclass(frozen=True, slots=True)
class TraceLoad:
    """Duty cycle driven by a request trace.

    The trace gives arrival times and token counts. The load at ``t`` is the token rate of
    requests arriving in the trailing ``window_s`` (times ``speedup``) over the replica's
    capacity, capped at 100 %. ``arrivals`` are seconds from the trace's first request and
    the curve wraps around at the trace's end.
    """

    arrivals: tuple[float, ...]
    cumulative_tokens: tuple[int, ...]  # tokens of requests [0, i)
    capacity_tokens_per_s: float
    window_s: float = 10.0
    speedup: float = 1.0
    share: float = 1.0  # this replica's share of the traffic

    @property
    def duration(self) -> float:
        return self.arrivals[-1] if self.arrivals else 0.0

    def at(self, t: float) -> float:
        if not self.arrivals or self.duration <= 0:
            return 0.0
        end = (t * self.speedup) % self.duration
        start = end - self.window_s * self.speedup
        tokens = self._tokens_between(start, end) if start >= 0 else (
            self._tokens_between(0.0, end) + self._tokens_between(self.duration + start,
                                                                  self.duration)
        )
        rate = tokens * self.share / self.window_s
        return _clamp(100.0 * rate / self.capacity_tokens_per_s)

    def _tokens_between(self, a: float, b: float) -> int:
        lo = bisect.bisect_left(self.arrivals, a)
        hi = bisect.bisect_left(self.arrivals, b)
        return self.cumulative_tokens[hi] - self.cumulative_tokens[lo]


def trace_load(requests: Sequence[TraceRequest], capacity_tokens_per_s: float,
               window_s: float = 10.0, speedup: float = 1.0, share: float = 1.0) -> TraceLoad:
    cumulative = [0]
    for r in requests:
        cumulative.append(cumulative[-1] + r.input_tokens + r.output_tokens)
    return TraceLoad(tuple(r.arrival_s for r in requests), tuple(cumulative),
                     capacity_tokens_per_s, window_s, speedup, share)
