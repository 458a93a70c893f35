"""The fault matrix (bench/fault_matrix.py) as a test: several agents over real gRPC, each
fault held past the staleness bound, every answer checked against the truth. Timings are
reported by the bench script, not asserted here; the test holds the invariant (no OK
answer below the truth), that each fault is said (UNAVAILABLE with a reason) and that each
recovers once it ends."""

from __future__ import annotations

import pytest

from bench.fault_matrix import run_matrix

pytestmark = pytest.mark.slow


async def test_no_ok_answer_is_ever_smaller_than_the_truth() -> None:
    out = await run_matrix(hold_s=2.5, interval=0.2)
    assert out["too_small"] == 0, [(r.name, r.too_small) for r in out["results"]]
    for r in out["results"]:
        assert r.answers > 0, r.name
        if r.affects:
            assert r.to_unavailable_s is not None, f"{r.name}: never said UNAVAILABLE"
            assert r.reasons, f"{r.name}: UNAVAILABLE without a reason"
            assert all(len(why) > 20 for why in r.reasons), (r.name, r.reasons)
        assert r.to_recovery_s is not None, f"{r.name}: not recovered after the fault ended"
    # Every hostile reference refused, 600 of each kind over the two rounds: a 1 MB
    # namespace by the transport (past KEDA's port's 80 KiB message limit, before Python
    # sees it), a 16 KiB metadata map - under that limit - by the scaler's own checks.
    memory = out["memory"]
    answers = {k: v for k, v in memory.items() if k.startswith("answers_")}
    assert answers == {"answers_RESOURCE_EXHAUSTED": 600, "answers_INVALID_ARGUMENT": 600}
