"""The lower bound, checked by hand on small traces, and against policies that meet the
SLO (a bound above any of them would not be one)."""

from __future__ import annotations

import pytest

from gpuscale.models.serving import ServingParams
from gpuscale.models.slo import SLO_TTFT_S
from gpuscale.sim.fluid_bound import lower_bound
from gpuscale.sim.reference import work_start
from gpuscale.traffic.patterns import synthetic
from gpuscale.traffic.trace import TraceRequest

PARAMS = ServingParams(max_batch=256, kv_tokens=400_000, prefill_tps=30_000.0,
                       decode_tps_per_seq=60.0, decode_tps_max=12_000.0, cold_start_s=90.0)


def test_one_request_needs_one_replica_from_a_cold_start_before_it_until_it_can_end() -> None:
    # Prefill 3000 / 30000 = 0.1 s; output 600 at 60/s = 10 s; latest admission 100 + 1.9;
    # the replica exists from 11.9 (a 90-s cold start before) to 110.1: the seconds whose
    # middle lies in that span are 12 .. 109.
    b = lower_bound([TraceRequest(100.0, 3000, 600)], 300.0, PARAMS, slo_s=2.0,
                    cold_start_s=90.0)
    assert b.floor_hours * 3600 == pytest.approx(98)
    assert b.extra_hours == 0
    assert b.work_hours * 3600 == pytest.approx(0.1 + 600 / 12_000)


def test_the_opening_replicas_are_warm() -> None:
    b = lower_bound([TraceRequest(10.0, 3000, 600)], 300.0, PARAMS, slo_s=2.0,
                    cold_start_s=90.0)
    assert b.floor_hours * 3600 == pytest.approx(20)  # seconds 0 .. 19


def test_the_default_cold_start_is_the_fastest_draw() -> None:
    b = lower_bound([TraceRequest(100.0, 3000, 600)], 300.0, PARAMS, slo_s=2.0)
    assert b.floor_hours * 3600 == pytest.approx(98 - 10)  # from 80 s before, not 90


def test_only_work_that_can_be_done_in_the_window_counts() -> None:
    # 200 requests 1.5 s before the end: prefill 100/30,000 s each, then at most
    # (1.5 - 0.0033) s x 46.875 tokens (a full batch's per-sequence rate) of 1,800.
    reqs = [TraceRequest(298.5, 100, 1800) for _ in range(200)]
    b = lower_bound(reqs, 300.0, PARAMS, slo_s=2.0, cold_start_s=90.0)
    prefill = 100 / 30_000
    decoded = (1.5 - prefill) * 12_000 / 256
    assert b.work_hours * 3600 == pytest.approx(200 * (prefill + decoded / 12_000))


def test_min_replicas_is_a_floor_everywhere() -> None:
    b = lower_bound([], 100.0, PARAMS, slo_s=2.0, min_replicas=2)
    assert b.gpu_hours * 3600 == pytest.approx(200)


def test_batch_slots_force_replicas() -> None:
    # 600 requests at t=10, each running at least 20 s (1200 tokens at 60/s): from their
    # latest admission (11.9) to their earliest end less the 1-s slack (30.0 - 1) they need
    # ceil(600 / 256) = 3 replicas.
    reqs = [TraceRequest(10.0, 10, 1200) for _ in range(600)]
    b = lower_bound(reqs, 60.0, PARAMS, slo_s=2.0)
    presence = 30  # seconds 0 .. 29 (warm from the window's start to 30.0003)
    three = 17  # seconds 12 .. 28
    assert b.floor_hours * 3600 == pytest.approx(presence + 2 * three)


def test_work_the_floors_cannot_absorb_is_added() -> None:
    # Decoding one sequence is as fast as a whole replica, so each request's presence is
    # short; 10 requests of 120,000 output tokens are 100 replica-seconds of work.
    fast = ServingParams(max_batch=256, kv_tokens=400_000, prefill_tps=30_000.0,
                         decode_tps_per_seq=12_000.0, decode_tps_max=12_000.0,
                         cold_start_s=90.0)
    reqs = [TraceRequest(0.0, 0, 120_000) for _ in range(10)]
    # A window long enough for all of it at the slowest decode (12,000 / 256 per sequence):
    # 3,000 s x 46.9 = 140,625 tokens each.
    b = lower_bound(reqs, 3000.0, fast, slo_s=2.0)
    assert b.work_hours * 3600 == pytest.approx(100)
    floors = b.floor_hours * 3600  # one replica for the first 10 s (1.9 .. 10 + slack)
    assert floors == pytest.approx(10)
    assert b.extra_hours * 3600 == pytest.approx(100 - floors)
    assert b.gpu_hours * 3600 == pytest.approx(100)


@pytest.mark.slow
def test_no_policy_that_meets_the_slo_is_below_the_bound() -> None:
    requests = synthetic("bursts", 1200.0, 6.0)
    duration = 1500.0
    feasible = work_start(requests, duration, PARAMS)
    assert feasible.slo_violation_minutes == 0
    b = lower_bound(requests, duration, PARAMS, slo_s=SLO_TTFT_S)
    assert b.gpu_hours <= feasible.gpu_hours
    assert b.gpu_hours >= b.work_hours
