"""Work that has arrived but that the served work does not show yet (``scaler.core.planner``,
the load the **steady** term and the hold read).

The planner counts a second's arrived work as what the pods served plus the growth of the
waiting queue times the mean work of one request. A request admitted straight into a batch
is served as it runs: its prefill at once, its decode over its whole run - seconds for a
chat reply, minutes for a reasoning model's thousands of generated tokens. While such a
load rises, the served work lags the work that arrived by up to a run: the sequences that
joined the batches carry decode the pods have not done yet, and a plan made from the
served work alone asks for the rise a run late (``reasoning``: a KV-bound load whose pods
were asked for 2-4 minutes after they were needed, 2 missed minutes on each seed).

``joined`` counts that decode when the sequences join: the rise of the running sequences
over the steady window - less those that came out of the queue, whose whole work was
counted when they queued - times the mean decode work of one request (generated tokens
over finished requests, the configured output until enough have finished), spread over the
window. Only a rise counts: sequences that end and pods removed never make the load
smaller than the served work shows (a plan is never smaller for it; a Ready pod without
its counters makes the whole observation unusable, so a pod's sequences never drop out of
the sum and come back as a rise). A sequence that joined is counted at one mean request's
decode whatever it has generated since, until its joining leaves the window.

Measured (``bench/bench_planner_alone.py --draws 4``, 2026-12-07, the means of 4
cold-start draws): the benchmark's 24 loads 121.27 -> 122.64 GPU-hours at 84.5 -> 80.5
SLO minutes, the 12 fresh ones 64.57 -> 65.14 at 27.5 -> 25.2; ``reasoning`` seeds 1-3
from 2 1 4 1 / 2 2 4 4 / 1 2 3 2 minutes to 0 1 4 1 / 0 0 0 1 / 0 0 0 0, at about the
hindsight reference's GPU-hours. Chat-length loads barely move (their runs are seconds).
"""

from __future__ import annotations

from gpuscale.scaler.core.plan_values import Observation, PlannerConfig
from gpuscale.scaler.core.windows import Window


def per_request(amount: Window, finished: Window, enough_finished: bool,
                configured: float) -> float:
    """The mean of ``amount`` (work, tokens) one request carries: its sum over the requests
    finished in the same window once ``enough_finished``; before, ``configured`` (the
    planner's request work and prompt, and the decode here, all read it so)."""
    n = min(len(amount.values), len(finished.values))
    if enough_finished and finished.last(n) > 0:
        return amount.last(n) / finished.last(n)
    return configured


def decode_work(config: PlannerConfig, generated: Window, finished: Window,
                enough_finished: bool) -> float:
    """Mean replica-seconds of one request's decode: the generated tokens per finished
    request (``per_request``; the configured ``output_tokens`` until enough finished)."""
    return config.work(0.0, per_request(generated, finished, enough_finished,
                                        config.output_tokens))


def joined(config: PlannerConfig, running: Window, waiting: Window, n: int,
           obs: Observation, decode: float) -> float:
    """Work per second (replica-seconds/s) of the sequences that joined the batches over
    the last ``n`` bins and were not in the queue before: max(0, the running sequences'
    rise + the queue's fall, if it fell) x ``decode``, over the ``n`` bins. 0 until
    ``n`` bins are held before ``obs``."""
    if n < 1 or len(running.values) <= n or len(waiting.values) <= n:
        return 0.0
    rise = (obs.running - running.values[-1 - n]
            + min(0.0, obs.waiting - waiting.values[-1 - n]))
    return max(0.0, rise) * decode / (n * config.resolution_s)
