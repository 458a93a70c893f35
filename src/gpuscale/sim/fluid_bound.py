"""A lower bound on the GPU-hours any scaling policy needs to serve a trace within its SLO,
in the serving model of ``control.serving``.

Which bound, and why it is one. A *fluid bound with per-second integer floors*: it relaxes
what makes scaling hard (replicas may appear without a cold start and do work of any
request at any moment after it arrived) and keeps only what no policy can avoid:

1. **Work.** A replica-second prefills at most ``prefill_tps`` prompt tokens or decodes at
   most ``decode_tps_max`` tokens (the serving model's ceilings), so a request costs at least
   ``prompt / prefill_tps + output / decode_tps_max`` replica-seconds, available from its
   arrival on. Only what must be done inside the window counts: the prefill, and the output
   tokens a running sequence gets by the window's end at the slowest rate the model decodes
   one (``decode_tps_max / max_batch``, a full batch sharing the replica).
2. **Presence.** Within the SLO a request must reach a replica that is Ready: a replica
   billed from ``cold_start_s`` before the request's latest admission (at the earliest from
   the start of the window, where the opening replicas are warm) until the request could at
   the earliest finish (its prefill, then its output at ``decode_tps_per_seq``, the fastest
   one sequence is decoded). So every second some request covers needs at least one
   replica.
3. **Batch and KV cache.** A request meeting the SLO is admitted by ``arrival + SLO -
   prefill`` at the latest and cannot finish before ``arrival + prefill + output /
   decode_tps_per_seq``; in between it holds one of a replica's ``max_batch`` sequences and
   at least its prompt in the KV cache. The requests that must be running at an instant
   need ``ceil(count / max_batch)`` and ``ceil(sum of prompts / kv_tokens)`` replicas.
   (Counted at the middle of each second, with one second of slack at the end of each
   request's span for the model's one-second steps.)

The floors of 2-3 give a per-second replica count ``f(t)`` that every policy meeting the
SLO pays at least. Work processed on those floors (first come, first served, each
replica-second at most one unit) is free; whatever work they cannot absorb needs that many
more replica-seconds. Bound = sum of f(t) + (total work - work the floors absorb): for any
policy c(t) >= f(t), the work it does is at most what f absorbs plus sum(c - f).

The bound ignores cold starts of replicas beyond the floors, per-step prefill budgets,
prefill deadlines, and the decode slow-down of small batches: every one only adds cost,
so each makes the bound looser, never wrong. ``min_replicas`` (default 0) is the floor a
policy's configuration imposes on itself; the bound to compare policies with is at 0.

Scope: the floors assume **every** request meets ``slo_s`` (a per-request objective). The
simulator judges a minute by the p95 of its arrivals, which lets up to 5 % of a minute's
requests wait; a policy can then spend less than the floors charge (a review built one: a
batch-slot floor paid for requests a p95 minute may leave waiting). So against p95 minutes
this is the bound for the stricter, per-request objective - a reference point, not a proof
that no p95 policy can do better; the benchmark reports every gap to it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from gpuscale.models.serving import ServingParams
from gpuscale.traffic.trace import TraceRequest


@dataclass(frozen=True, slots=True)
class Bound:
    gpu_hours: float
    floor_hours: float  # the part the per-second floors impose
    extra_hours: float  # work the floors could not absorb
    work_hours: float  # total work at the model's ceilings (itself a weaker bound)


def lower_bound(requests: Sequence[TraceRequest], duration: float, params: ServingParams,
                slo_s: float, min_replicas: int = 0,
                cold_start_s: float | None = None) -> Bound:
    """The bound over ``[0, duration)`` (1-s resolution). ``slo_s``: the time to first
    token every request must meet. ``cold_start_s``: the shortest start-up of a replica
    (default: the fastest of the model's start-up draws)."""
    seconds = max(1, math.ceil(duration))
    cold = (min(params.cold_start_s, params.cold_start_spread[0]) if cold_start_s is None
            else cold_start_s)
    slowest = min(params.decode_tps_per_seq, params.decode_tps_max / params.max_batch)
    presence = [0.0] * (seconds + 1)  # difference arrays: requests needing a replica,
    batch = [0.0] * (seconds + 1)  # ... holding a sequence, ... their prompts in KV cache
    kv = [0.0] * (seconds + 1)
    work = [0.0] * (seconds + 1)
    total = 0.0
    for r in requests:
        prefill = r.input_tokens / params.prefill_tps
        fastest_end = r.arrival_s + prefill + r.output_tokens / params.decode_tps_per_seq
        latest_admit = r.arrival_s + max(0.0, slo_s - prefill)
        by_end = max(0.0, duration - r.arrival_s - prefill) * slowest  # tokens, at least
        cost = (min(prefill, max(0.0, duration - r.arrival_s))
                + min(float(r.output_tokens), by_end) / params.decode_tps_max)
        total += cost
        arrived = min(seconds - 1, max(0, math.floor(r.arrival_s)))
        work[arrived] += cost
        _span(presence, latest_admit - cold, fastest_end, seconds, 1.0)
        _span(batch, latest_admit, fastest_end - 1.0, seconds, 1.0)
        _span(kv, latest_admit, fastest_end - 1.0, seconds,
              float(min(r.input_tokens, params.kv_tokens)))
    floor_total = absorbed = backlog = 0.0
    need_present = need_batch = kv_tokens = 0.0
    for t in range(seconds):
        need_present += presence[t]
        need_batch += batch[t]
        kv_tokens += kv[t]
        floor = max(min_replicas, 1 if need_present > 0.5 else 0,
                    math.ceil(need_batch / params.max_batch - 1e-9),
                    math.ceil(kv_tokens / params.kv_tokens - 1e-9))
        floor_total += floor
        backlog += work[t]
        done = min(backlog, float(floor))
        absorbed += done
        backlog -= done
    extra = max(0.0, total - absorbed)
    return Bound((floor_total + extra) / 3600.0, floor_total / 3600.0, extra / 3600.0,
                 total / 3600.0)


def _span(diff: list[float], start: float, end: float, seconds: int, amount: float) -> None:
    """Add ``amount`` to the seconds whose middle lies in [start, end)."""
    first = max(0, math.ceil(start - 0.5))
    last = min(seconds, math.ceil(end - 0.5))  # exclusive
    if first < last:
        diff[first] += amount
        diff[last] -= amount
