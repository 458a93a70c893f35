"""The planner's capacity before any queue (the batch the KV cache holds), the room it plans
over the work, and the load's growth: hand-computed values (``scaler.core.learned``,
``scaler.core.planner``)."""

from __future__ import annotations

import math

import pytest

from gpuscale.scaler.core.learned import BatchSums, batch_capacity
from gpuscale.scaler.core.planner import Observation, Planner
from tests.scaler.planner_load import CFG, busy, run

# 100 s of engines finishing one request a second of 6,000 prompt and 240 output tokens,
# 30 sequences running in 40 % of the KV cache, prefill taking 6,000 / 30,000 = 20 % of
# each second (so 30 x 0.8 sequence-seconds of decode a second): 10 tokens/s a sequence.
LONG = BatchSums(prompt=6_000 * 100, generated=240 * 100, finished=100, running=3_000,
                 kv=4_000, decoding=2_400)


def test_a_full_kv_cache_bounds_what_a_replica_delivers() -> None:
    # 30 sequences in 40 %: 75 fit. Each decodes 10 tokens/s in what prefill leaves, so at
    # lam requests/s it holds its slot 240 / (10 x (1 - lam x 0.2)) s; 75 slots carry
    # lam = 75 x 10 / (240 + 75 x 10 x 0.2) = 1.923/s, of 0.2 + 240 / 12,000 = 0.22
    # replica-seconds each.
    rate = 750 / (240 + 150)
    assert batch_capacity(CFG, LONG) == pytest.approx(rate * 0.22)
    assert batch_capacity(CFG, LONG) == pytest.approx(0.423, abs=0.001)


def test_no_bound_where_the_batch_is_not_what_limits() -> None:
    # Short prompts: the configured batch of 256 binds before the cache, and 256
    # sequences decoding at 50 tokens/s would pass the configured 12,000: the decode
    # figure is the bound, i.e. the configuration itself.
    short = BatchSums(prompt=500 * 2_000, generated=200 * 2_000, finished=2_000,
                      running=40 * 100, kv=5 * 100, decoding=40 * 100 * 0.97)
    assert batch_capacity(CFG, short) == 1.0


@pytest.mark.parametrize("sums", [
    BatchSums(6_000 * 5, 240 * 5, 5, 150, 200, 120),  # 5 requests finished: no mean yet
    BatchSums(6_000 * 100, 240 * 100, 100, 0, 0, 0),  # nothing running
    BatchSums(6_000 * 100, 0, 100, 3_000, 4_000, 2_400),  # nothing generated
    BatchSums(6_000 * 100, 240 * 100, 100, 3_000, 0, 2_400),  # no KV reported
    BatchSums(6_000 * 100, 240 * 100, 100, 3_000, 4_000, 200),  # prefill takes 93 %
])
def test_unreadable_sums_bound_nothing(sums: BatchSums) -> None:
    assert batch_capacity(CFG, sums) == 1.0


def test_the_floor_of_a_learned_capacity_holds() -> None:
    # Each sequence holds 90 % of the cache: 1.1 fit, carrying 1.11 x 300 / (240 + 1.11 x
    # 300 x 0.2) = 1.09 requests/s of 0.22 replica-seconds, 0.24 of the configuration -
    # below the floor, which is taken (a figure that low is more likely a misreading than
    # a replica, and would plan four times the replicas).
    tiny = BatchSums(6_000 * 100, 240 * 100, 100, running=100, kv=9_000, decoding=80)
    assert batch_capacity(CFG, tiny) == pytest.approx(0.25)


def _long_prompts(ready: int) -> Observation:
    """The mix of ``LONG`` on ``ready`` pods, no request waiting."""
    return Observation(prompt_tps=6_000.0 * ready, generation_tps=240.0 * ready,
                       finished_rate=1.0 * ready, waiting=0.0, running=30.0 * ready,
                       kv_cache=40.0 * ready, ready=ready, starting=0)


def test_the_planner_plans_on_the_batch_capacity_before_any_queue() -> None:
    p = Planner(CFG)
    run(p, range(0, 120), _long_prompts(4))
    plan = p.current(119.0)
    assert p.batch_capacity == pytest.approx(0.423, abs=0.001)
    assert plan.capacity == p.batch_capacity  # no queue: nothing learned from one
    work = 4 * (6_000 / 30_000 + 240 / 12_000) / plan.capacity  # 0.88 replica-s/s
    assert plan.steady == pytest.approx(work + 0.25 * math.sqrt(2 * work))  # room at 0.8
    # The configured figures alone would have planned 0.88 / 0.8 -> 2 replicas for what
    # 4 pods with a queue-free cache at 40 % carry: the batch's bound says 3.
    assert plan.unheld == 3


def test_short_requests_keep_the_configured_capacity() -> None:
    p = Planner(CFG)
    obs = Observation(prompt_tps=10_000.0, generation_tps=4_000.0, finished_rate=20.0,
                      waiting=0.0, running=40.0, kv_cache=5.0, ready=1, starting=0)
    run(p, range(0, 120), obs)
    assert p.current(119.0).capacity == 1.0


def test_room_is_proportional_for_a_few_replicas_and_grows_as_the_root_beyond() -> None:
    # Utilization 0.8: room 0.25 of the work up to 2 replicas' worth; beyond, 0.25 x
    # sqrt(2 x work) - a pool of 32 replicas' work plans 32 + 0.25 x 8 = 34, not 40.
    for work, expected in ((1.0, 1.25), (2.0, 2.5), (8.0, 9.0), (32.0, 34.0),
                           (4.0, 4.0 + 0.25 * math.sqrt(8.0))):
        p = Planner(CFG)
        run(p, range(0, 70), busy(work, ready=math.ceil(work)))
        assert p.current(69.0).steady == pytest.approx(expected)


def test_a_load_that_stopped_rising_is_planned_without_growth() -> None:
    """The growth is the smaller of the 5-minute slope and the slope of its last half: a
    ramp that has levelled off for half the window plans no growth (the 5-minute slope
    alone still showed the ramp: a step or a ramp that ended asked for up to half the
    load again for minutes)."""
    p = Planner(CFG)
    for t in range(0, 300):  # rising 0.01 replica-seconds/s a second for 5 minutes
        p.observe(float(t), busy(1.0 + 0.01 * t, ready=5))
    assert p.current(299.0).growth > 0
    run(p, range(300, 451), busy(4.0, ready=5))  # then flat at 4 for 151 s
    plan = p.current(450.0)
    assert plan.growth == 0.0
    assert plan.steady == pytest.approx(4.0 + 0.25 * math.sqrt(2 * 4.0))
