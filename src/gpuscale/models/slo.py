"""Service-level objectives over a serving model's requests, judged minute by minute.

A minute is bad when the ``quantile`` (p95 by default) of its arrivals' measure exceeds
the target. A request never served (still queued, or cut off and re-queued, at the end)
measures infinity: enough of them make the minute bad, and any of them makes the minute's
worst infinite. Measures, per ``SloSpec.kind``:

- ``ttft``: time to first token, arrival to the end of its prefill (seconds).
- ``queue``: queue delay, arrival to admission (the start of its prefill; seconds).
- ``ttft-per-token``: (TTFT - ``allowance_s``) / max(prompt tokens, 1), seconds per
  prompt token: long prompts may take proportionally longer, past a fixed allowance.
- ``ttft-tpot``: a request is served well when its TTFT is within ``target_s`` *and* its
  time per output token (TPOT, the mean over its stream) within ``tpot_s`` - the two
  bounds a streaming client feels (as DistServe's SLO attainment counts a request). Its
  measure is the worse of the two in TTFT's units: max(TTFT, TPOT x ``target_s`` /
  ``tpot_s``), so a minute is bad when more than 1 - ``quantile`` of its requests miss
  either bound. TPOT is (last token - first token) / output tokens: the serving model
  decodes all of them after the first token, which its prefill makes (``ServingModel``);
  a request of one output token has none. A request still decoding when the run is judged
  counts the pace it has kept so far.

Every judgement also reports the p95 TPOT of the finished requests, whatever the kind: a
schedule can keep its first tokens fast by letting a crowded batch decode slowly, which a
TTFT objective does not see.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import chain
from typing import Literal

from gpuscale.models.serving import InFlightRequest, ServingModel

SloKind = Literal["ttft", "queue", "ttft-per-token", "ttft-tpot"]


@dataclass(frozen=True, slots=True)
class SloSpec:
    """What counts as served well: the ``quantile`` of a minute's ``kind`` measure at most
    ``target_s`` (seconds; seconds per prompt token for ``ttft-per-token``)."""

    kind: SloKind = "ttft"
    target_s: float = 2.0
    quantile: float = 0.95
    allowance_s: float = 0.0  # ttft-per-token only: TTFT that is free of the per-token rate
    tpot_s: float = 0.1  # ttft-tpot only: the bound on the time per output token

    def __post_init__(self) -> None:
        if self.kind not in ("ttft", "queue", "ttft-per-token", "ttft-tpot"):
            raise ValueError(f"SLO kind {self.kind!r} is not ttft, queue, ttft-per-token "
                             f"or ttft-tpot")
        if (not self.target_s > 0 or not 0 < self.quantile <= 1 or not self.allowance_s >= 0
                or not self.tpot_s > 0):
            raise ValueError("an SLO needs target_s > 0, 0 < quantile <= 1, allowance_s >= 0 "
                             "and tpot_s > 0")

    def measure(self, req: InFlightRequest, now: float | None = None) -> float:
        """This request's measure; infinite when it never got its first token. ``now``:
        where a ``ttft-tpot`` request is still decoding, its pace up to then counts (None:
        only a finished request's TPOT counts)."""
        if req.first_token is None or req.admitted is None:
            return math.inf
        if self.kind == "queue":
            return req.admitted - req.arrival
        ttft = req.first_token - req.arrival
        if self.kind == "ttft":
            return ttft
        if self.kind == "ttft-tpot":
            return max(ttft, tpot(req, now) * self.target_s / self.tpot_s)
        return (ttft - self.allowance_s) / max(req.prompt, 1)

    def at_least(self, req: InFlightRequest, now: float) -> float:
        """What ``measure`` will be at least, seen at ``now``: the measure of a request that
        has its first token; for one still waiting, the measure it would have if its first
        token came at ``now`` (it can only come later: the measures grow with the wait). A
        queue delay is known once the request is admitted (a drain that cuts it only makes
        it longer)."""
        if req.first_token is not None and req.admitted is not None:
            if self.kind != "ttft-tpot" or req.finished is not None:
                return self.measure(req, now)
            # Decoding: its pace so far only grows - unless a drain cuts it and it starts
            # over, and then its first token comes after now.
            ttft = req.first_token - req.arrival
            return max(ttft, min(tpot(req, now) * self.target_s / self.tpot_s,
                                 now - req.arrival))
        if self.kind == "queue" and req.admitted is not None:
            return req.admitted - req.arrival
        if self.kind != "ttft-per-token":
            return now - req.arrival
        return (now - req.arrival - self.allowance_s) / max(req.prompt, 1)

    def describe(self) -> str:
        q = f"p{self.quantile * 100:g}"
        if self.kind == "ttft":
            return f"{q} time to first token <= {self.target_s:g} s"
        if self.kind == "queue":
            return f"{q} queue delay <= {self.target_s:g} s"
        if self.kind == "ttft-tpot":
            return (f"{q} of requests with time to first token <= {self.target_s:g} s and "
                    f"time per output token <= {self.tpot_s * 1000:g} ms")
        return (f"{q} time to first token <= {self.allowance_s:g} s + "
                f"{self.target_s * 1000:g} ms per prompt token")


def tpot(req: InFlightRequest, now: float | None = None) -> float:
    """Time per output token after the first: (last token - first token) / output tokens
    (see the module); for a request still decoding, the pace so far up to ``now``; 0.0
    when there is none (one output token) or it is not known (no first token; still
    decoding and no ``now``)."""
    if req.first_token is None or req.output <= 1:
        return 0.0
    end = req.finished if req.finished is not None else now
    if end is None:
        return 0.0
    return max(0.0, end - req.first_token) / req.output


DEFAULT_SLO = SloSpec()
SLO_TTFT_S = DEFAULT_SLO.target_s  # the default objective: p95 TTFT <= 2 s per minute
# Named objectives for the command line: the default, a queue-delay one and a
# prompt-length-aware one (1 s allowance + 0.5 ms per prompt token: an 8k prompt gets 5 s;
# prefill alone is ~0.04 ms per token on an H100).
SLO_SPECS: dict[str, SloSpec] = {
    "ttft": DEFAULT_SLO,
    "queue": SloSpec("queue", 1.0),
    "ttft-per-token": SloSpec("ttft-per-token", 0.0005, allowance_s=1.0),
    # 100 ms a token: ~10 tokens/s, faster than a person reads a stream
    "ttft-tpot": SloSpec("ttft-tpot", 2.0, tpot_s=0.1),
}


def quantile(values: list[float], q: float) -> float:
    """Nearest-rank quantile of sorted ``values`` (0.0 when empty)."""
    if not values:
        return 0.0
    return values[max(0, math.ceil(q * len(values)) - 1)]


@dataclass(frozen=True, slots=True)
class Slo:
    """How a serving model met its objective over ``minutes``."""

    minutes: int
    bad_minutes: frozenset[int]  # minutes whose arrivals' quantile is above the target
    worst: dict[int, float]  # minute -> worst measure of its arrivals (inf: never served)
    p95_ttft_s: float  # of all requests that got a first token
    unserved: int  # requests still queued or running
    spec: SloSpec = DEFAULT_SLO
    stat: dict[int, float] = field(default_factory=dict)  # minute -> the quantile judged
    p95_tpot_s: float = 0.0  # of the finished requests with more than one output token

    @classmethod
    def of(cls, model: ServingModel, duration: float, spec: SloSpec = DEFAULT_SLO) -> Slo:
        """Judge every request that arrived: finished ones, running ones that got a first
        token, and never-served ones (queued; infinite). Minutes at or past ``duration``
        (arrivals in the last partial minute) are not judged."""
        minutes = max(1, int(duration // 60))
        running = [r for rep in model.replicas + model.draining for r in rep.running]
        per_minute: dict[int, list[float]] = {}
        ttft: list[float] = []
        tpots = [tpot(r) for r in model.done if r.output > 1 and r.finished is not None]
        for req in chain(model.done, running, model.queue):
            value = spec.measure(req, duration)
            per_minute.setdefault(int(req.arrival // 60), []).append(value)
            if req.first_token is not None:
                ttft.append(req.first_token - req.arrival)
        stat: dict[int, float] = {}
        worst: dict[int, float] = {}
        for m, values in per_minute.items():
            values.sort()
            worst[m], stat[m] = values[-1], quantile(values, spec.quantile)
        bad = frozenset(m for m, v in stat.items() if v > spec.target_s and m < minutes)
        ttft.sort()
        tpots.sort()
        return cls(minutes, bad, worst, quantile(ttft, 0.95),
                   len(model.queue) + len(running), spec, stat, quantile(tpots, 0.95))

