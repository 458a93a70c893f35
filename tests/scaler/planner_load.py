"""The planner tests' load: engines serving a given share of a replica's work (planner
terms are checked against hand-computed values in test_planner*.py)."""

from __future__ import annotations

from gpuscale.scaler.core.planner import Observation, Planner, PlannerConfig

CFG = PlannerConfig(delay_s=2.0, startup_s=100.0, prefill_tps=30_000.0, decode_tps=12_000.0,
                    max_batch=256, utilization=0.8, memory_s=600.0)
# One request of the configured 1000 prompt + 250 output tokens, in replica-seconds.
REQUEST = 1000 / 30_000 + 250 / 12_000


def busy(fraction: float, *, waiting: float = 0.0, running: float = 0.0, ready: int = 1,
         starting: int = 0, kv: float = 0.0, finished: float = 0.0) -> Observation:
    """Engines serving ``fraction`` replica-seconds per second, half prefill, half decode."""
    return Observation(prompt_tps=fraction / 2 * 30_000, generation_tps=fraction / 2 * 12_000,
                       finished_rate=finished, waiting=waiting, running=running,
                       kv_cache=kv, ready=ready, starting=starting)


def run(planner: Planner, seconds: range, obs: Observation) -> None:
    for t in seconds:
        planner.observe(float(t), obs)
