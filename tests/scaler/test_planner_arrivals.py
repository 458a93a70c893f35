"""The decode of sequences that joined the batches, counted when they join
(``scaler.core.arrivals``): checked against hand-computed values, on its own and in the
planner's steady term."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuscale.scaler.core.arrivals import decode_work, joined, per_request
from gpuscale.scaler.core.planner import Planner
from gpuscale.scaler.core.windows import Window
from tests.scaler.planner_load import CFG, busy

# A reasoning-length request: 6,000 generated tokens are half a replica-second of decode.
LONG = replace(CFG, output_tokens=6_000.0)
DECODE = 6_000 / 12_000


def _window(values: list[float]) -> Window:
    w = Window(len(values))
    for v in values:
        w.push(v)
    return w


def test_sequences_that_joined_count_their_decode_over_the_window() -> None:
    running = _window([10.0] + [10.0 + t for t in range(1, 61)])  # 10 -> 70 in 60 s
    waiting = _window([0.0] * 61)
    got = joined(LONG, running, waiting, 60, busy(1.0, running=70.0), DECODE)
    assert got == pytest.approx(60 * DECODE / 60)


def test_sequences_out_of_the_queue_were_counted_when_they_queued() -> None:
    running = _window([10.0] * 31 + [40.0] * 30)  # 30 join the batches ...
    waiting = _window([30.0] * 31 + [0.0] * 30)  # ... from the queue
    assert joined(LONG, running, waiting, 60, busy(1.0, running=40.0), DECODE) == 0.0
    # 10 of them new: only those count
    waiting = _window([20.0] * 31 + [0.0] * 30)
    got = joined(LONG, running, waiting, 60, busy(1.0, running=40.0), DECODE)
    assert got == pytest.approx(10 * DECODE / 60)


def test_sequences_that_end_never_lower_the_load() -> None:
    running = _window([70.0] + [70.0 - t for t in range(1, 61)])
    waiting = _window([0.0] * 61)
    assert joined(LONG, running, waiting, 60, busy(1.0, running=10.0), DECODE) == 0.0


def test_nothing_is_counted_before_a_whole_window_is_held() -> None:
    running, waiting = _window([0.0, 50.0]), _window([0.0, 0.0])
    assert joined(LONG, running, waiting, 60, busy(1.0, running=50.0), DECODE) == 0.0
    assert joined(LONG, running, waiting, 0, busy(1.0, running=50.0), DECODE) == 0.0


def test_one_requests_decode_is_configured_until_enough_have_finished() -> None:
    generated, finished = _window([1_200.0] * 10), _window([0.5] * 10)
    assert decode_work(LONG, generated, finished, False) == pytest.approx(DECODE)
    # 12,000 tokens over 5 requests: 2,400 tokens each, at 12,000 tokens/s
    assert decode_work(LONG, generated, finished, True) == pytest.approx(0.2)


def test_a_mean_per_request_is_read_only_from_requests_that_finished() -> None:
    """The one rule the request's work, its prompt (the TTFT budget) and its decode read."""
    prompts, finished = _window([4_000.0] * 10), _window([2.0] * 10)
    assert per_request(prompts, finished, True, 1_000.0) == pytest.approx(2_000.0)
    assert per_request(prompts, finished, False, 1_000.0) == 1_000.0
    none = _window([0.0] * 10)  # nothing finished: never a division by zero
    assert per_request(prompts, none, True, 1_000.0) == 1_000.0


def _planner(running: list[float], work: float = 1.0) -> Planner:
    p = Planner(LONG)
    for t, r in enumerate(running):
        p.observe(float(t), busy(work, running=r, ready=4))
    return p


def test_steady_counts_the_decode_of_sequences_that_joined() -> None:
    """The served work is flat (the new sequences have barely begun to decode); 60 joined
    in the last minute with half a replica-second of decode each: half a replica-second
    per second more load, with room at 0.8 - and the hold keeps it while they run."""
    rising = _planner([20.0] * 200 + [20.0 + t for t in range(1, 61)], work=1.5)
    flat = _planner([20.0] * 260, work=1.5)
    assert flat.current(259.0).steady == pytest.approx(1.5 / 0.8)
    assert rising.current(259.0).steady == pytest.approx(2.0 / 0.8)
    assert (flat.current(259.0).held, rising.current(259.0).held) == (2, 3)
    assert rising.current(259.0).terms()["joined"] == pytest.approx(0.5)  # on /metrics
    assert flat.current(259.0).joined == 0.0
    falling = _planner([80.0] * 200 + [80.0 - t for t in range(1, 61)], work=1.5)
    assert falling.current(259.0).steady == pytest.approx(1.5 / 0.8)
