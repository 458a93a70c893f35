"""The simulator's service-level objectives (gpuscale.models.slo): each kind judged per
minute from finished, queued and still-decoding requests, never-served minutes, and TPOT."""

from __future__ import annotations

import math
from typing import Any

import pytest

from gpuscale.models.serving import ServingParams

# Round figures for arithmetic by hand (not the calibrated defaults).
HAND = ServingParams(max_batch=64, kv_tokens=400_000, prefill_tps=20_000.0,
                     decode_tps_per_seq=60.0, decode_tps_max=2_500.0, cold_start_s=90.0,
                     cold_start_spread=(90.0, 90.0))


def test_slo_kinds_and_never_served_minutes() -> None:
    from gpuscale.models.serving import InFlightRequest, ServingModel
    from gpuscale.models.slo import Slo, SloSpec

    model = ServingModel(HAND)
    served = [InFlightRequest(float(s), 8_000, 5) for s in range(20)]  # minute 0
    for k, r in enumerate(served):
        r.admitted, r.first_token = r.arrival + 0.1 * k, r.arrival + 0.1 * k + 0.4
    model.done.extend(served)
    late = InFlightRequest(61.0, 100, 5)  # minute 1: served, and one never served
    late.admitted, late.first_token = 61.0, 61.1
    model.done.append(late)
    model.queue.append(InFlightRequest(62.0, 100, 5))
    ttft = Slo.of(model, 180.0)
    # Minute 0: TTFTs 0.4 .. 2.3 s; p95 of 20 is the 19th: 2.2 s > 2 s.
    assert ttft.stat[0] == pytest.approx(2.2)
    assert ttft.worst[0] == pytest.approx(2.3)
    # Minute 1 has a served request too, yet its worst is infinite (never served).
    assert ttft.worst[1] == math.inf
    assert ttft.bad_minutes == {0, 1}
    assert ttft.unserved == 1
    relaxed = Slo.of(model, 180.0, SloSpec("ttft", 2.5))
    assert relaxed.bad_minutes == {1}  # one slow request does not fail a p95 of 20
    queue = Slo.of(model, 180.0, SloSpec("queue", 1.85))
    assert queue.stat[0] == pytest.approx(1.8)  # queue delays 0 .. 1.9 s
    assert queue.bad_minutes == {1}
    # 8,000-token prompts: (2.2 - 1 s allowance) / 8,000 = 0.15 ms per token.
    per_token = Slo.of(model, 180.0, SloSpec("ttft-per-token", 0.0002, allowance_s=1.0))
    assert per_token.stat[0] == pytest.approx(1.2 / 8_000)
    assert per_token.bad_minutes == {1}
    with pytest.raises(ValueError, match="kind"):
        SloSpec("latency")  # type: ignore[arg-type]


def test_ttft_tpot_counts_a_request_that_decodes_slowly_and_reports_tpot() -> None:
    """A request served well needs its first token within 2 s and each later one within
    100 ms; the p95 TPOT of finished requests is reported whatever the objective."""
    from gpuscale.models.serving import InFlightRequest, ServingModel
    from gpuscale.models.slo import SLO_SPECS, Slo, SloSpec, tpot

    model = ServingModel(HAND)
    fast = [InFlightRequest(float(s), 100, 10) for s in range(20)]  # minute 0
    for r in fast:  # TTFT 0.5 s, then 10 tokens in 0.5 s: 50 ms each
        r.admitted, r.first_token, r.finished = r.arrival, r.arrival + 0.5, r.arrival + 1.0
    slow = [InFlightRequest(60.0 + s, 100, 10) for s in range(20)]  # minute 1
    for k, r in enumerate(slow):  # TTFT 0.5 s; three of them decode at 150 ms a token
        r.admitted, r.first_token = r.arrival, r.arrival + 0.5
        r.finished = r.first_token + (1.5 if k < 3 else 0.5)
    model.done.extend(fast + slow)
    decoding = InFlightRequest(170.0, 100, 100)  # minute 2: still decoding at 180 s
    decoding.admitted, decoding.first_token, decoding.generated = 170.0, 170.5, 1.0
    one = InFlightRequest(130.0, 100, 1)  # one output token (the model still decodes it)
    one.admitted, one.first_token, one.finished = 130.0, 130.2, 130.25
    model.done.append(one)
    assert tpot(one) == 0.0  # no tokens after the first: no TPOT
    assert SLO_SPECS["ttft-tpot"].measure(one) == pytest.approx(0.2)  # its TTFT
    assert tpot(decoding) == 0.0  # still decoding, no time given: not known
    assert tpot(decoding, 173.5) == pytest.approx(3.0 / 100)  # the pace so far
    spec = SLO_SPECS["ttft-tpot"]
    assert (spec.target_s, spec.tpot_s) == (2.0, 0.1)
    assert "100 ms" in spec.describe()
    model.replicas.append(_replica_running(decoding))
    both = Slo.of(model, 180.0, spec)
    # Minute 1: 3 of 20 over 100 ms a token (150 ms -> 3.0 s in TTFT's units): the p95
    # (the 19th of 20) is one of them.
    assert both.stat[1] == pytest.approx(0.15 * 2.0 / 0.1)
    assert both.bad_minutes == {1}
    assert both.stat[0] == pytest.approx(1.0)  # 50 ms a token -> 1.0 s, under 2
    # Minute 2: the request still decoding counts its pace up to the judgement (9.5 s
    # for 100 tokens: 95 ms a token -> 1.9 s), the one-token request its TTFT.
    assert both.stat[2] == pytest.approx(1.9)
    assert Slo.of(model, 180.0).bad_minutes == frozenset()  # TTFT alone: all fine
    # p95 TPOT over the 40 finished requests with more than one output token (37 at 50 ms,
    # 3 at 150: the 38th is one of the slow)
    assert both.p95_tpot_s == pytest.approx(0.15)
    assert Slo.of(model, 180.0).p95_tpot_s == pytest.approx(0.15)
    with pytest.raises(ValueError, match="tpot_s"):
        SloSpec("ttft-tpot", 2.0, tpot_s=0.0)


def _replica_running(req: Any) -> Any:
    from gpuscale.models.serving import Replica

    rep = Replica(0.0, 0.0)
    rep.running.append(req)
    return rep
