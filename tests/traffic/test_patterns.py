"""The synthetic traffic patterns (gpuscale.traffic.patterns): each seeded, sorted and
reproducible, with the shape its name promises; which of them are shaped (a rate curve)."""

from __future__ import annotations

import pytest

from gpuscale.traffic.trace import TraceRequest


def test_synthetic_patterns_have_their_shape_and_are_reproducible() -> None:
    from gpuscale.traffic.patterns import synthetic

    day = synthetic("diurnal", 3600.0, 10.0)
    assert day == synthetic("diurnal", 3600.0, 10.0)
    first, middle = (sum(1 for r in day if a <= r.arrival_s < a + 600) for a in (0, 1500))
    assert middle > 3 * first  # busy in the middle of the "day"
    night = synthetic("idle-night", 3600.0, 10.0)
    assert max(r.arrival_s for r in night) < 1800.0
    gap = synthetic("idle-gap", 3600.0, 10.0)
    assert not [r for r in gap if 1080.0 <= r.arrival_s < 2520.0]  # quiet 30-70 %
    assert len([r for r in gap if r.arrival_s >= 2520.0]) > 5000  # then demand again
    bursts = synthetic("bursts", 3600.0, 10.0)
    in_burst = sum(1 for r in bursts if 720 <= r.arrival_s < 840)
    calm = sum(1 for r in bursts if 300 <= r.arrival_s < 420)
    assert in_burst > 4 * calm


def test_shape_of_gives_a_shaped_pattern_and_refuses_the_others() -> None:
    from gpuscale.traffic.patterns import shape_of

    rate, peak = shape_of("burst10", 3600.0)
    assert peak == 1.0
    assert [t for t in range(3600) if rate(t) >= peak] == list(range(1440, 1620))
    for other in ("long-prompts", "long-prompt-bursts", "noisy-diurnal", "reasoning", "x"):
        with pytest.raises(ValueError, match="is not a shaped pattern"):
            shape_of(other, 3600.0)


@pytest.mark.parametrize("pattern", ["steps", "ramp", "burst10", "short-bursty",
                                     "long-prompts", "long-prompt-bursts",
                                     "noisy-diurnal", "reasoning"])
def test_new_patterns_are_seeded_and_sorted(pattern: str) -> None:
    from gpuscale.traffic.patterns import PATTERNS, synthetic

    assert pattern in PATTERNS
    got = synthetic(pattern, 1800.0, 5.0)
    assert got == synthetic(pattern, 1800.0, 5.0)
    assert got != synthetic(pattern, 1800.0, 5.0, seed=2)
    assert [r.arrival_s for r in got] == sorted(r.arrival_s for r in got)
    assert all(0 <= r.arrival_s < 1800.0 for r in got)


def test_new_patterns_have_their_shape() -> None:
    from gpuscale.traffic.patterns import synthetic

    def count(reqs: list[TraceRequest], a: float, b: float) -> int:
        return sum(1 for r in reqs if a <= r.arrival_s < b)

    steps = synthetic("steps", 3000.0, 10.0)  # 600 s stretches at 25/50/100/50/25 %
    first, peak, last = (count(steps, a, a + 600) for a in (0, 1200, 2400))
    assert peak > 3 * first
    assert peak > 3 * last
    ramp = synthetic("ramp", 3000.0, 10.0)
    thirds = [count(ramp, a, a + 500) for a in (0, 500, 1000, 1500, 2000, 2500)]
    assert thirds[0] < thirds[1] < thirds[2]
    assert thirds[3] > thirds[4] > thirds[5]
    burst = synthetic("burst10", 3600.0, 10.0)  # x10 for 180 s from 1440 s
    assert count(burst, 1440, 1620) > 6 * count(burst, 1000, 1180)
    short = synthetic("short-bursty", 600.0, 20.0)
    assert count(short, 0, 10) + count(short, 60, 70) > 5 * (count(short, 20, 30)
                                                             + count(short, 80, 90))
    assert sum(r.input_tokens for r in short) / len(short) < 300
    lpb = synthetic("long-prompt-bursts", 3600.0, 12.0)
    longs = [r.arrival_s for r in lpb if r.input_tokens >= 8_000]
    # Six bursts of 90 s at 3 long prompts/s: ~1,600 of them, each within 90 s of another
    # (none alone), and the ordinary requests (4/s) stay all hour.
    assert 1_200 < len(longs) < 2_000
    assert all(min(abs(a - b) for b in longs if b != a) < 5.0 for a in longs)
    assert len(lpb) - len(longs) > 3.5 * 3600
    noisy = synthetic("noisy-diurnal", 3600.0, 10.0)
    halves = [count(noisy, a, a + 1200) for a in (0, 1200, 2400)]
    assert halves[1] > 1.5 * halves[0]  # the day's middle is still busier
    per_30s = [count(noisy, a, a + 30) for a in range(1200, 2400, 30)]
    assert max(per_30s) > 1.8 * min(per_30s)  # and it wanders within it
    reasoning = synthetic("reasoning", 3600.0, 60.0)
    assert 1.5 < len(reasoning) / 3600 < 2.1  # diurnal at 3/s at its busiest, 60 % on average
    outputs = sorted(r.output_tokens for r in reasoning)
    assert 4_000 < outputs[len(outputs) // 2] < 6_000  # minutes of decode each
    assert all(r.output_tokens % 24 == 0 for r in reasoning)
    long = synthetic("long-prompts", 1800.0, 2.0)
    assert all(4_000 <= r.input_tokens <= 8_192 for r in long)
    assert abs(len(long) / 1800.0 - 2.0) < 0.6
