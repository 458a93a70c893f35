"""Scaling a trace (gpuscale.traffic.scale.scale_trace): looping it, raising its rate by
superposing shifted copies (no same-instant bursts), and refusing nonsense."""

from __future__ import annotations

import pytest

from gpuscale.traffic.scale import scale_trace
from gpuscale.traffic.trace import TraceRequest, read_trace
from tests.support.repo import AZURE_CONV

TRACE = AZURE_CONV


def test_looping_plays_the_trace_again_one_period_later() -> None:
    trace = read_trace(TRACE)[:200]
    once = scale_trace(trace, rate=1.0, speedup=1.0, limit_s=None)
    twice = scale_trace(trace, rate=1.0, speedup=1.0, limit_s=None, loops=2)
    assert len(twice) == 2 * len(once)
    offset = twice[len(once)].arrival_s - once[0].arrival_s
    assert offset > once[-1].arrival_s  # the second copy starts after the first ends
    for a, b in zip(once, twice[len(once):], strict=True):
        assert abs(b.arrival_s - a.arrival_s - offset) < 1e-6
        assert (a.input_tokens, a.output_tokens) == (b.input_tokens, b.output_tokens)
    # Time compression applies to the looped copies too, and the cut still holds.
    fast = scale_trace(trace, rate=1.0, speedup=2.0, limit_s=None, loops=2)
    assert abs(fast[-1].arrival_s - twice[-1].arrival_s / 2) < 1e-6
    cut = scale_trace(trace, rate=1.0, speedup=1.0, limit_s=offset, loops=3)
    assert len(cut) == len(once)


def test_looping_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        scale_trace(read_trace(TRACE)[:10], 1.0, 1.0, None, loops=0)
    assert scale_trace([], 1.0, 1.0, None, loops=3) == []


def test_load_scaling_superposes_shifted_copies() -> None:
    trace = [TraceRequest(t, 100 + int(t), 10) for t in (0.0, 10.0, 25.0, 60.0, 90.0)]
    period = 90.0 + 90.0 / 4  # the span plus the mean gap, as a loop repeats
    double = scale_trace(trace, rate=2.0, speedup=1.0, limit_s=None)
    # Copy 1 is the trace shifted by half the period, wrapped into [0, period).
    shifted = [((t + period / 2) % period, 100 + int(t)) for t in (0.0, 10.0, 25.0, 60.0, 90.0)]
    want = sorted([(r.arrival_s, r.input_tokens) for r in trace] + shifted)
    assert [(r.arrival_s, r.input_tokens) for r in double] == want
    assert all(0.0 <= r.arrival_s < period for r in double)
    # No two requests at one instant, unlike duplicates would be.
    assert len({r.arrival_s for r in double}) == len(double)
    # A fractional rate thins one extra copy, deterministically: 2.4 = 2 copies + 0.4.
    more = scale_trace(trace, rate=2.4, speedup=1.0, limit_s=None)
    assert len(more) == 5 + 5 + 2
    assert more == scale_trace(trace, rate=2.4, speedup=1.0, limit_s=None)
    assert [r.arrival_s for r in more] == sorted(r.arrival_s for r in more)
    assert len(scale_trace(trace, rate=0.4, speedup=1.0, limit_s=None)) == 2


def test_scaled_shipped_trace_keeps_its_rate_without_same_instant_bursts() -> None:
    trace = read_trace(TRACE)[:2_000]
    x4 = scale_trace(trace, rate=4.0, speedup=1.0, limit_s=None)
    assert len(x4) == 4 * len(trace)
    per_instant: dict[float, int] = {}
    for r in x4:
        per_instant[r.arrival_s] = per_instant.get(r.arrival_s, 0) + 1
    assert max(per_instant.values()) < 4  # duplicating would put 4 at every instant
