"""The serving replica model: capacity, queueing, cold starts, duty-cycle saturation."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuscale.models.cold_start import SLOT_DRAWS
from gpuscale.models.serving import (
    GPU_TYPES,
    InFlightRequest,
    ServingModel,
    ServingParams,
    kv_capacity_tokens,
)

# Round figures for arithmetic by hand (not the calibrated defaults): a replica with a
# batch of 64, 400k tokens of KV cache, prefill at 20,000 tokens/s, decode at 60 tokens/s
# per sequence and 2,500 tokens/s in all, and no cold start.
HAND = ServingParams(max_batch=64, kv_tokens=400_000, prefill_tps=20_000.0,
                     decode_tps_per_seq=60.0, decode_tps_max=2_500.0, cold_start_s=0.0)


def run(model: ServingModel, rate: float, seconds: int, prompt: int = 500,
        output: int = 200, dt: float = 1.0) -> None:
    acc = 0.0
    for step in range(int(seconds / dt)):
        now = step * dt
        acc += rate * dt
        arrivals = [InFlightRequest(now, prompt, output) for _ in range(int(acc))]
        acc -= len(arrivals)
        model.arrive(arrivals)
        model.step(now, dt)


def ttfts(model: ServingModel) -> list[float]:
    return [r.first_token - r.arrival for r in model.done if r.first_token is not None]


def test_light_load_completes_with_short_time_to_first_token() -> None:
    model = ServingModel(HAND)
    model.set_replicas(1, 0.0)
    run(model, rate=2.0, seconds=120)
    assert len(model.done) > 200
    assert max(ttfts(model)) < 0.5  # prefill of 500 tokens at 20k tok/s, no queue
    assert len(model.queue) == 0


def test_overload_queues_and_more_replicas_fix_it() -> None:
    # 15 req/s x 200 output tokens = 3,000 tok/s to decode. One replica decodes at most
    # 2,500 tok/s, less the time prefill takes (15 x 500 / 20,000 = 0.375 s of each second):
    # ~1,560 tok/s - overloaded. Two replicas: ~2,030 tok/s each - enough.
    one = ServingModel(HAND)
    one.set_replicas(1, 0.0)
    run(one, rate=15.0, seconds=120)
    two = ServingModel(HAND)
    two.set_replicas(2, 0.0)
    run(two, rate=15.0, seconds=120)
    assert len(one.queue) > 100  # capacity short: the queue grows
    assert len(two.queue) < 20
    assert sorted(ttfts(one))[len(ttfts(one)) // 2] > 5 * sorted(ttfts(two))[len(ttfts(two)) // 2]


def test_cold_start_is_billed_but_serves_nothing() -> None:
    model = ServingModel(replace(HAND, cold_start_s=90.0, cold_start_spread=(90.0, 90.0)))
    model.set_replicas(1, 0.0)
    run(model, rate=1.0, seconds=60)
    assert model.done == []
    assert model.gpu_seconds == 60.0
    assert model.signals(59.0)[0].ready is False


def test_duty_cycle_saturates_long_before_the_batch_is_full() -> None:
    model = ServingModel(replace(HAND, saturating_batch=4))
    model.set_replicas(1, 0.0)
    model.arrive([InFlightRequest(0.0, 100, 3_000) for _ in range(4)])
    model.step(0.0, 1.0)
    small = model.signals(1.0)[0]
    model.arrive([InFlightRequest(1.0, 100, 3_000) for _ in range(56)])
    model.step(1.0, 1.0)
    big = model.signals(2.0)[0]
    assert (small.running, big.running) == (4, 60)
    assert small.duty_cycle == big.duty_cycle == 100.0  # utilization cannot tell them apart
    assert big.kv_cache > small.kv_cache  # the KV cache can


def test_scale_down_loses_no_request() -> None:
    model = ServingModel(HAND)
    model.set_replicas(3, 0.0)
    arrived = [InFlightRequest(0.0, 200, 5_000) for _ in range(50)]
    model.arrive(arrived)
    model.step(0.0, 1.0)
    model.set_replicas(1, 1.0)

    def accounted() -> int:
        running = sum(len(r.running) for r in model.replicas + model.draining)
        return running + len(model.queue) + len(model.done)

    assert accounted() == 50
    assert len(model.draining) == 2  # the two removed replicas finish what they run
    for t in range(1, 40):
        model.step(float(t), 1.0)
        assert accounted() == 50
    # 5,000-token outputs cannot finish in the 30 s grace period: cut off, they went back
    # to the queue and the survivor runs them; the drained replicas are gone.
    assert model.draining == []
    assert len(model.replicas[0].running) + len(model.queue) == 50
    assert model.cut > 0  # counted (exact figures in the next test)


def _three_with_loads(idlest_first: bool) -> ServingModel:
    """Three Ready replicas holding 1, 5 and 3 long requests (oldest to youngest), and a
    fourth, youngest of all, still starting."""
    model = ServingModel(replace(HAND, cold_start_s=90.0, cold_start_spread=(90.0, 90.0)),
                         idlest_first=idlest_first)
    model.set_replicas(3, 0.0, warm=True)
    for rep, n in zip(model.replicas, (1, 5, 3), strict=True):
        rep.running.extend(InFlightRequest(0.0, 100, 50_000) for _ in range(n))
    model.set_replicas(4, 0.0)  # not Ready until 90 s
    return model


@pytest.mark.parametrize(("idlest_first", "removed_loads"), [
    (False, [0, 3, 5]),  # the starting one, then the youngest Ready ones
    (True, [0, 1, 3]),  # the starting one, then the fewest running requests
])
def test_scale_down_picks_pods_as_a_replicaset_does(idlest_first: bool,
                                                    removed_loads: list[int]) -> None:
    model = _three_with_loads(idlest_first)
    removed = []
    for n in (3, 2, 1):
        before = list(model.replicas)
        model.set_replicas(n, 10.0)
        (gone,) = [rep for rep in before if rep not in model.replicas]
        removed.append(len(gone.running))
    assert removed == removed_loads
    # The drain's deadline (30 s) cuts what the removed replicas still run: 50,000 tokens
    # take far longer. Counted, they start over on the survivor.
    for t in range(10, 45):
        model.step(float(t), 1.0)
    assert model.cut == sum(removed_loads)
    assert len(model.replicas) == 1


def test_draining_finishes_short_requests_and_is_billed() -> None:
    model = ServingModel(replace(HAND, drain_s=30.0))
    model.set_replicas(2, 0.0)
    model.arrive([InFlightRequest(0.0, 200, 100) for _ in range(20)])
    model.step(0.0, 1.0)
    assert all(rep.running for rep in model.replicas)  # balanced over both
    model.set_replicas(1, 1.0)
    billed = model.gpu_seconds
    model.step(1.0, 1.0)
    assert model.gpu_seconds - billed == 2.0  # the draining replica still costs its GPU
    for t in range(2, 10):
        model.step(float(t), 1.0)
    assert len(model.done) == 20  # nothing was cut off or restarted
    assert model.draining == []
    assert len(model.queue) == 0


def test_a_new_replica_is_billed_and_starts_cold_from_the_same_instant() -> None:
    model = ServingModel(replace(HAND, cold_start_s=90.0, cold_start_spread=(90.0, 90.0)))
    model.set_replicas(1, 0.0, warm=True)
    model.step(0.0, 1.0)
    model.set_replicas(2, 1.0)  # decided in [0, 1): created at its end
    new = model.replicas[1]
    assert (new.created, new.ready_at) == (1.0, 91.0)
    for t in range(1, 91):
        model.step(float(t), 1.0)
    assert model.gpu_seconds == 91.0 + 90.0  # the second billed from 1 s, not ready yet
    assert model.signals(90.0)[1].ready is False
    assert model.signals(91.0)[1].ready is True


def test_ttft_counts_from_arrival_and_prefill_overflow_carries() -> None:
    model = ServingModel(HAND)
    model.set_replicas(1, 0.0)
    late = InFlightRequest(0.9, 2_000, 10)  # arrives late in the step: 0.1 s of prefill
    long = InFlightRequest(1.0, 30_000, 10)  # 1.5 s of prefill: past the next step's end
    after = InFlightRequest(1.2, 2_000, 10)
    model.arrive([late])
    model.step(0.0, 1.0)
    assert late.first_token == pytest.approx(1.0)  # from its arrival, not from 0
    model.arrive([long, after])
    model.step(1.0, 1.0)
    assert long.first_token == pytest.approx(2.5)
    model.step(2.0, 1.0)  # the replica is busy until 2.5: the next prefill waits for it
    assert after.admitted == pytest.approx(2.5)
    assert after.first_token == pytest.approx(2.6)
    for r in (late, long, after):
        assert r.first_token is not None
        assert r.admitted is not None
        assert r.first_token - r.arrival >= r.prompt / HAND.prefill_tps - 1e-9
        assert r.admitted >= r.arrival


def test_a_replica_never_does_more_than_a_second_of_work_per_second() -> None:
    # Far more arrivals than one replica can serve, with long prompts that overflow steps.
    model = ServingModel(HAND)
    model.set_replicas(1, 0.0)
    rep = model.replicas[0]
    prompt_s = gen_s = 0.0
    for k in range(300):
        now = k * 1.0
        model.arrive([InFlightRequest(now + j / 7, 3_000 + 997 * j, 150 + 31 * j)
                      for j in range(7)])
        model.step(now, 1.0)
        work = ((rep.prompt_tokens - prompt_s) / HAND.prefill_tps
                + (rep.generation_tokens - gen_s) / HAND.decode_tps_max)
        assert work <= 1.0 + 1e-9
        prompt_s, gen_s = rep.prompt_tokens, rep.generation_tokens
    # ...and it is busy: the bound is met, not undershot by an idle model.
    assert (rep.prompt_tokens / HAND.prefill_tps
            + rep.generation_tokens / HAND.decode_tps_max) > 0.95 * 300
    signals = model.signals(300.0)[0]
    assert signals.prompt_tokens_total == rep.prompt_tokens
    assert signals.generation_tokens_total == rep.generation_tokens
    assert signals.finished_total == rep.finished == len(model.done) > 0
    assert rep.generation_tokens >= sum(r.output for r in model.done)


def test_cold_starts_are_drawn_per_replica_within_the_spread() -> None:
    p = ServingParams()
    starts = [p.cold_start(i) for i in range(2_000)]
    assert all(80.0 <= s <= 300.0 for s in starts)
    assert abs(sum(starts) / len(starts) - p.cold_start_s) < 5.0
    assert len({round(s, 3) for s in starts[:10]}) == 10  # not all the same
    assert starts == [ServingParams().cold_start(i) for i in range(2_000)]  # seeded
    model = ServingModel(p)
    model.set_replicas(3, 10.0)
    assert [r.ready_at - 10.0 for r in model.replicas] == starts[:3]


def test_cold_starts_drawn_by_the_moment_meet_the_same_start_up() -> None:
    """With ``cold_start_slot_s`` two runs that create a replica in the same slot draw the
    same start-up, however many each created before; without, by creation number."""
    p = ServingParams(cold_start_slot_s=60.0)
    early, late = ServingModel(p), ServingModel(p)
    early.set_replicas(3, 5.0)  # three in slot 0 ...
    late.set_replicas(1, 50.0)  # ... one in slot 0, made 45 s later
    assert early.replicas[0].ready_at - 5.0 == pytest.approx(late.replicas[0].ready_at - 50.0)
    early.set_replicas(4, 130.0)  # the first of slot 2 in both
    late.set_replicas(2, 170.0)
    assert early.replicas[3].ready_at - 130.0 == pytest.approx(late.replicas[1].ready_at - 170.0)
    assert early.replicas[3].ready_at - 130.0 == pytest.approx(p.cold_start(2 * SLOT_DRAWS))
    assert [r.number for r in early.replicas] == [0, 1, 2, 3]  # names stay in order
    early.set_replicas(5, 131.0)  # the second of slot 2: its own draw
    assert early.replicas[4].ready_at - 131.0 == pytest.approx(p.cold_start(2 * SLOT_DRAWS + 1))
    by_number = ServingModel(ServingParams())
    by_number.set_replicas(1, 50.0)
    by_number.set_replicas(2, 170.0)
    assert by_number.replicas[1].ready_at - 170.0 == pytest.approx(ServingParams().cold_start(1))


def test_gpu_types_follow_their_hardware() -> None:
    h100, a100, l4 = (GPU_TYPES[k] for k in ("h100", "a100", "l4"))
    assert h100 == ServingParams()
    assert h100.kv_tokens == kv_capacity_tokens(81559) == 456_504
    assert h100.prefill_tps > a100.prefill_tps > l4.prefill_tps
    assert h100.decode_tps_max > a100.decode_tps_max > l4.decode_tps_max
    assert l4.kv_tokens < 40_000  # 24 GB holds the 16 GB of weights and little else


def test_an_mi300x_holds_more_kv_and_serves_faster_than_an_h100() -> None:
    """From AMD's datasheet (192 GB, 1307 TFLOPS dense bf16, 5.3 TB/s), through the same
    arithmetic as the NVIDIA parts: more KV cache, faster prefill and decode."""
    from gpuscale.models.serving import GPU_TYPES

    h100, mi300x = GPU_TYPES["h100"], GPU_TYPES["mi300x"]
    assert mi300x.kv_tokens > 2 * h100.kv_tokens
    assert mi300x.prefill_tps > h100.prefill_tps
    assert mi300x.decode_tps_max == pytest.approx(12_000 * 5.3 / 3.35)


@pytest.mark.parametrize(("round_robin", "after"), [
    (False, [6, 6, 6]),  # least loaded first: the new requests even the three out
    (True, [7, 8, 3]),  # in turn: each gets its third, whatever it already runs
])
def test_routing_least_loaded_or_in_turn(round_robin: bool, after: list[int]) -> None:
    """Three Ready replicas running 4, 5 and 0 long requests; nine arrive at once."""
    model = ServingModel(HAND, round_robin=round_robin)
    model.set_replicas(3, 0.0, warm=True)
    for rep, n in zip(model.replicas, (4, 5, 0), strict=True):
        rep.running.extend(InFlightRequest(0.0, 1, 50_000) for _ in range(n))
    model.arrive([InFlightRequest(0.0, 1, 50_000) for _ in range(9)])
    model.step(0.0, 1.0)
    assert [len(rep.running) for rep in model.replicas] == after
    assert not model.queue


def test_a_request_finishes_inside_a_step_at_its_own_pace() -> None:
    """TPOT is measured from when each request's last token came, not the step's end: one
    request alone decodes at the per-sequence rate (60 tokens/s) times what prefill leaves
    of the step (its own 0.1 s: 0.9)."""
    model = ServingModel(HAND)
    model.set_replicas(1, 0.0)
    model.arrive([InFlightRequest(0.0, 2_000, 31)])  # prefill 0.1 s, then 31 tokens
    for step in range(3):
        model.step(float(step), 1.0)
    [done] = model.done
    assert done.first_token == pytest.approx(0.1)
    assert done.finished == pytest.approx(0.1 + 31 / (60 * 0.9))  # not 1.0, the step's end
    assert done.finished is not None
    alone = (done.finished - 0.1) / done.output
    # Beside a crowd (15 prompts a second: prefill takes 0.375 of every step), decode
    # slows: each request's own finish shows it.
    crowd = ServingModel(HAND)
    crowd.set_replicas(1, 0.0)
    run(crowd, rate=15.0, seconds=60)
    paces = sorted((r.finished - r.first_token) / r.output for r in crowd.done
                   if r.finished is not None and r.first_token is not None)
    assert len(paces) > 100
    assert paces[len(paces) // 2] > 1.3 * alone
