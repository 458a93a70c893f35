"""Scaling a trace (gpuscale.traffic.scale.scale_trace): looping it, raising its rate in
place (jittered copies that keep the load's shape over the day) or by the old rotating
mode (copies shifted around the trace's period), no same-instant bursts, and refusing
nonsense."""

from __future__ import annotations

import itertools
import math

import pytest

from gpuscale.traffic.patterns import synthetic
from gpuscale.traffic.scale import JITTER_S, scale_trace
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


def test_rotating_mode_superposes_shifted_copies() -> None:
    trace = [TraceRequest(t, 100 + int(t), 10) for t in (0.0, 10.0, 25.0, 60.0, 90.0)]
    period = 90.0 + 90.0 / 4  # the span plus the mean gap, as a loop repeats
    double = scale_trace(trace, rate=2.0, speedup=1.0, limit_s=None, mode="rotate")
    # Copy 1 is the trace shifted by half the period, wrapped into [0, period).
    shifted = [((t + period / 2) % period, 100 + int(t)) for t in (0.0, 10.0, 25.0, 60.0, 90.0)]
    want = sorted([(r.arrival_s, r.input_tokens) for r in trace] + shifted)
    assert [(r.arrival_s, r.input_tokens) for r in double] == want
    assert all(0.0 <= r.arrival_s < period for r in double)
    # No two requests at one instant, unlike duplicates would be.
    assert len({r.arrival_s for r in double}) == len(double)
    # A fractional rate thins one extra copy, deterministically: 2.4 = 2 copies + 0.4.
    more = scale_trace(trace, rate=2.4, speedup=1.0, limit_s=None, mode="rotate")
    assert len(more) == 5 + 5 + 2
    assert more == scale_trace(trace, rate=2.4, speedup=1.0, limit_s=None, mode="rotate")
    assert [r.arrival_s for r in more] == sorted(r.arrival_s for r in more)
    assert len(scale_trace(trace, rate=0.4, speedup=1.0, limit_s=None, mode="rotate")) == 2


def test_rotated_shipped_trace_keeps_its_rate_without_same_instant_bursts() -> None:
    trace = read_trace(TRACE)[:2_000]
    x4 = scale_trace(trace, rate=4.0, speedup=1.0, limit_s=None, mode="rotate")
    assert len(x4) == 4 * len(trace)
    per_instant: dict[float, int] = {}
    for r in x4:
        per_instant[r.arrival_s] = per_instant.get(r.arrival_s, 0) + 1
    assert max(per_instant.values()) < 4  # duplicating would put 4 at every instant


def _hourly(requests: list[TraceRequest], hours: int) -> list[int]:
    counts = [0] * hours
    for r in requests:
        counts[min(hours - 1, int(r.arrival_s // 3600))] += 1
    return counts


def test_in_place_keeps_a_days_shape_where_rotating_moves_it() -> None:
    hours = 8
    day = synthetic("diurnal", hours * 3600.0, 0.5, seed=3)  # low at both ends, high mid-way
    base = _hourly(day, hours)
    assert base[0] * 3 < base[hours // 2]  # a shape worth keeping
    for n in (2, 4):
        placed = scale_trace(day, rate=float(n), speedup=1.0, limit_s=None)
        assert len(placed) == n * len(day)
        got = _hourly(placed, hours)
        # Every hour carries n x its own load (a jitter of +-30 s moves a few across an
        # hour's edge, never the day's shape).
        for want, have in zip(base, got, strict=True):
            assert abs(have - n * want) <= 0.03 * n * want + 5
        rotated = _hourly(scale_trace(day, rate=float(n), speedup=1.0, limit_s=None,
                                      mode="rotate"), hours)
        # Rotating puts a copy's midday into the trace's night: the first hour far above n x.
        assert rotated[0] > 1.5 * n * base[0]
        assert max(r.arrival_s for r in placed) <= max(r.arrival_s for r in day)


def test_in_place_copies_stay_near_their_originals_without_same_instant_bursts() -> None:
    trace = read_trace(TRACE)[:2_000]
    x4 = scale_trace(trace, rate=4.0, speedup=1.0, limit_s=None)
    assert len(x4) == 4 * len(trace)
    assert len({r.arrival_s for r in x4}) == len(x4)  # duplicating would put 4 at each
    # The requests (tokens) are the trace's, four times each.
    tokens = sorted((r.input_tokens, r.output_tokens) for r in trace)
    assert sorted((r.input_tokens, r.output_tokens) for r in x4) == sorted(tokens * 4)
    # Each minute holds about four times its own arrivals.
    minutes = math.ceil(trace[-1].arrival_s / 60) + 1
    base = [0] * minutes
    for r in trace:
        base[int(r.arrival_s // 60)] += 1
    scaled = [0] * minutes
    for r in x4:
        scaled[int(r.arrival_s // 60)] += 1
    window = int(JITTER_S // 60) + 1
    for m in range(window, minutes - window):  # over a few minutes: all four copies' own
        near = sum(base[m - window:m + window + 1])
        got = sum(scaled[m - window:m + window + 1])
        assert abs(got - 4 * near) <= 0.25 * 4 * near + 40


def test_in_place_fractional_rates_thin_at_random_reproducibly() -> None:
    trace = read_trace(TRACE)[:1_000]
    for rate, want in ((0.25, 250), (0.5, 500), (1.5, 1_500), (2.4, 2_400), (3.0, 3_000)):
        got = scale_trace(trace, rate=rate, speedup=1.0, limit_s=None)
        assert len(got) == want
        assert got == scale_trace(trace, rate=rate, speedup=1.0, limit_s=None, seed=1)
    half = scale_trace(trace, rate=0.5, speedup=1.0, limit_s=None)
    other = scale_trace(trace, rate=0.5, speedup=1.0, limit_s=None, seed=2)
    assert half != other
    assert len(other) == 500
    # Thinning keeps requests where they were: a subset of the trace itself.
    assert set(half) <= set(trace)
    # It is not every other request (a pattern a periodic thinning would print on the load).
    kept = {r.arrival_s for r in half}
    alternate = sum(1 for a, b in itertools.pairwise(trace)
                    if (a.arrival_s in kept) != (b.arrival_s in kept))
    assert alternate < 0.8 * len(trace)
    # A seed changes the jitter of added copies too, not their count.
    assert (scale_trace(trace, 2.0, 1.0, None, seed=5)
            != scale_trace(trace, 2.0, 1.0, None, seed=6))


def test_rates_and_modes_refused() -> None:
    trace = read_trace(TRACE)[:10]
    for bad in (0.0, -1.0, math.nan, math.inf, 1e12):
        with pytest.raises(ValueError, match="rate"):
            scale_trace(trace, bad, 1.0, None)
    with pytest.raises(ValueError, match="place, rotate"):
        scale_trace(trace, 2.0, 1.0, None, mode="shift")  # type: ignore[arg-type]
    one = [TraceRequest(5.0, 10, 10)] * 3  # one instant: copies coincide, stay at it
    assert {r.arrival_s for r in scale_trace(one, 2.0, 1.0, None)} == {0.0}


def test_load_requests_passes_the_mode_and_names_the_option() -> None:
    from gpuscale.common.errors import ConfigError
    from gpuscale.traffic.requests import load_requests

    placed, _ = load_requests(None, TRACE, 2.0, 300.0)
    rotated, _ = load_requests(None, TRACE, 2.0, 300.0, rate_mode="rotate")
    trace = scale_trace(read_trace(TRACE), 2.0, 1.0, 300.0)
    assert placed == trace
    assert rotated == scale_trace(read_trace(TRACE), 2.0, 1.0, 300.0, mode="rotate")
    assert placed != rotated
    with pytest.raises(ConfigError, match="--rate: rate 1e"):
        load_requests(None, TRACE, 1e9, None)
