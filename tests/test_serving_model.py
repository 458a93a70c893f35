"""The serving replica model: capacity, queueing, cold starts, duty-cycle saturation."""

from __future__ import annotations

from gpuscale.control.serving import Request, ServingFleet, ServingParams


def run(fleet: ServingFleet, rate: float, seconds: int, prompt: int = 500,
        output: int = 200, dt: float = 1.0) -> None:
    acc = 0.0
    for step in range(int(seconds / dt)):
        now = step * dt
        acc += rate * dt
        arrivals = [Request(now, prompt, output) for _ in range(int(acc))]
        acc -= len(arrivals)
        fleet.arrive(arrivals)
        fleet.step(now, dt)


def ttfts(fleet: ServingFleet) -> list[float]:
    return [r.first_token - r.arrival for r in fleet.done if r.first_token is not None]


def test_light_load_completes_with_short_time_to_first_token() -> None:
    fleet = ServingFleet(ServingParams(cold_start_s=0.0))
    fleet.set_replicas(1, 0.0)
    run(fleet, rate=2.0, seconds=120)
    assert len(fleet.done) > 200
    assert max(ttfts(fleet)) < 0.5  # prefill of 500 tokens at 20k tok/s, no queue
    assert len(fleet.queue) == 0


def test_overload_queues_and_more_replicas_fix_it() -> None:
    # 15 req/s x 200 output tokens = 3,000 tok/s to decode. One replica decodes at most
    # 2,500 tok/s, less the time prefill takes (15 x 500 / 20,000 = 0.375 s of each second):
    # ~1,560 tok/s - overloaded. Two replicas: ~2,030 tok/s each - enough.
    one = ServingFleet(ServingParams(cold_start_s=0.0))
    one.set_replicas(1, 0.0)
    run(one, rate=15.0, seconds=120)
    two = ServingFleet(ServingParams(cold_start_s=0.0))
    two.set_replicas(2, 0.0)
    run(two, rate=15.0, seconds=120)
    assert len(one.queue) > 100  # capacity short: the queue grows
    assert len(two.queue) < 20
    assert sorted(ttfts(one))[len(ttfts(one)) // 2] > 5 * sorted(ttfts(two))[len(ttfts(two)) // 2]


def test_cold_start_is_billed_but_serves_nothing() -> None:
    fleet = ServingFleet(ServingParams(cold_start_s=90.0))
    fleet.set_replicas(1, 0.0)
    run(fleet, rate=1.0, seconds=60)
    assert fleet.done == []
    assert fleet.gpu_seconds == 60.0
    assert fleet.signals(59.0)[0].ready is False


def test_duty_cycle_saturates_long_before_the_batch_is_full() -> None:
    fleet = ServingFleet(ServingParams(cold_start_s=0.0, saturating_batch=4))
    fleet.set_replicas(1, 0.0)
    fleet.arrive([Request(0.0, 100, 3_000) for _ in range(4)])
    fleet.step(0.0, 1.0)
    small = fleet.signals(1.0)[0]
    fleet.arrive([Request(1.0, 100, 3_000) for _ in range(56)])
    fleet.step(1.0, 1.0)
    big = fleet.signals(2.0)[0]
    assert (small.running, big.running) == (4, 60)
    assert small.duty_cycle == big.duty_cycle == 100.0  # utilization cannot tell them apart
    assert big.kv_cache > small.kv_cache  # the KV cache can


def test_scale_down_loses_no_request() -> None:
    fleet = ServingFleet(ServingParams(cold_start_s=0.0))
    fleet.set_replicas(3, 0.0)
    arrived = [Request(0.0, 200, 5_000) for _ in range(50)]
    fleet.arrive(arrived)
    fleet.step(0.0, 1.0)
    fleet.set_replicas(1, 1.0)

    def accounted() -> int:
        running = sum(len(r.running) for r in fleet.replicas + fleet.draining)
        return running + len(fleet.queue) + len(fleet.done)

    assert accounted() == 50
    assert len(fleet.draining) == 2  # the two removed replicas finish what they run
    for t in range(1, 40):
        fleet.step(float(t), 1.0)
        assert accounted() == 50
    # 5,000-token outputs cannot finish in the 30 s grace period: cut off, they went back
    # to the queue and the survivor runs them; the drained replicas are gone.
    assert fleet.draining == []
    assert len(fleet.replicas[0].running) + len(fleet.queue) == 50


def test_draining_finishes_short_requests_and_is_billed() -> None:
    fleet = ServingFleet(ServingParams(cold_start_s=0.0, drain_s=30.0))
    fleet.set_replicas(2, 0.0)
    fleet.arrive([Request(0.0, 200, 100) for _ in range(20)])
    fleet.step(0.0, 1.0)
    assert all(rep.running for rep in fleet.replicas)  # balanced over both
    fleet.set_replicas(1, 1.0)
    billed = fleet.gpu_seconds
    fleet.step(1.0, 1.0)
    assert fleet.gpu_seconds - billed == 2.0  # the draining replica still costs its GPU
    for t in range(2, 10):
        fleet.step(float(t), 1.0)
    assert len(fleet.done) == 20  # nothing was cut off or restarted
    assert fleet.draining == []
    assert len(fleet.queue) == 0
