"""The planner's drain floor (``scaler.core.planner``): how far below the Ready pods a plan
may go without cutting too many of the requests they run.

**Draining** (``drain_s``, the pods' termination grace): a removed pod finishes what it
runs for ``drain_s``, then the rest is cut and starts over (its time to first token counts
from its arrival). A request runs ``request_s`` on average (Little's law: running over
finished, the last ``REQUEST_MEMORY_S``). Taking run times as exponential, removing m of N
Ready pods cuts m / N x ``cut_share`` of a minute's requests - e^(-drain_s / request_s) of
those in flight, and requests that arrived more than a run time before the removal have
mostly ended. The plan goes below the Ready pods by at most as many as keep that within
``CUT_SHARE``, and after a step that cuts, not again until the minutes it cut are over
(the longer of a minute and ``request_s``; sooner if pods are added). Until a minute has
been seen, a planner with requests running keeps the Ready pods. With chat requests (a few
seconds) nothing is held; reasoning-length outputs (minutes) on a handful of pods keep
their pods while requests run (measured: 9-12 missed minutes an hour become 1-2, at the
GPU-hours the hindsight reference spends), and so do requests of 20 s or more on 3 pods or
fewer (a 30-s grace). A grace longer than the requests (``terminationGracePeriodSeconds``
and ``drainSeconds``, with an engine that drains on SIGTERM) frees the plan. A restarted
scaler forgets the last step's wait (it keeps the pods that exist for a hold first).
"""

from __future__ import annotations

import math

from gpuscale.scaler.core.plan_values import Observation, PlannerConfig
from gpuscale.scaler.core.windows import BASE_BLOCK_S

CUT_SHARE = 0.02  # of the requests in flight a scale-down may cut (a p95 objective has 5 %)


class Drain:
    """The drain floor of one workload, and the wait after the last step down that cut."""

    def __init__(self, config: PlannerConfig) -> None:
        self.config = config
        # (until, floor, Ready pods then): the last step down that cut requests
        self._cut: tuple[int, int, int] | None = None

    def clear(self) -> None:
        self._cut = None

    def cut_share(self, request_s: float) -> float:
        """Of a minute's requests, the share that removing every Ready pod would cut (one
        pod of N: this over N). A request that arrived x seconds before the removal is
        cut when it runs longer than x + ``drain_s``: with run times exponential of mean
        T, e^(-(x + drain_s) / T); averaged over the minute's arrivals,
        e^(-drain_s / T) x (T / 60)(1 - e^(-60 / T))."""
        if request_s <= 0:
            return 0.0
        t, w = request_s, float(BASE_BLOCK_S)
        return math.exp(-self.config.drain_s / t) * (t / w) * -math.expm1(-w / t)

    def floor(self, second: int, obs: Observation, request_s: float | None) -> int:
        """The fewest Ready pods a scale-down may leave now; 0 when nothing running would
        be cut."""
        if obs.running < 1:
            self._cut = None
            return 0
        if request_s is None:
            return obs.ready  # not a minute seen yet: keep the pods that run requests
        if self._cut is not None:
            until, floor, ready = self._cut
            if second < until and obs.ready <= ready:
                return floor  # a step down was taken: none again while it cuts
            self._cut = None
        share = self.cut_share(request_s)
        if share <= 0:
            return 0
        return max(0, obs.ready - math.floor(CUT_SHARE * obs.ready / share))

    def took_step(self, second: int, obs: Observation, replicas: int,
                  request_s: float | None) -> None:
        """A plan below the Ready pods that cuts a measurable share (a tenth of
        ``CUT_SHARE``) starts the wait before the next: until the minutes whose requests
        it cut are over (the longer of a minute and ``request_s``)."""
        if (self._cut is not None or request_s is None or replicas >= obs.ready
                or obs.running < 1):
            return
        cut = (obs.ready - replicas) / obs.ready * self.cut_share(request_s)
        if cut >= CUT_SHARE / 10:
            wait = self.config.bins(max(request_s, float(BASE_BLOCK_S)))
            self._cut = (second + wait, replicas, obs.ready)
