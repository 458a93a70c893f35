"""The planner in the simulator, through the scaler's own code.

Every simulated second, each Ready replica's engine counters (prompt and generated tokens,
finished requests) become per-pod rates over the last second, as the agent computes them
from vLLM's counters; with its running and waiting requests and KV-cache use they become
PodRecords in a FleetView, and ``scaler.state.plan_book.observe`` + ``scaler.core.planner.Planner``
make the plan exactly as the scaler does once a second. KEDA and the HPA (their models in
``run_policy``) read ``planned x targetValue`` as an External AverageValue metric when
they poll, and hold (UNAVAILABLE) when there is no plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gpuscale.common.errors import DataUnavailable
from gpuscale.models.hpa import SCALE_DOWN, Metric, MetricSource, TargetType
from gpuscale.models.serving import ServingModel, ServingParams, planner_metadata
from gpuscale.scaler.core.planner import Planner, PlanUnavailable
from gpuscale.scaler.core.selector import parse_selector
from gpuscale.scaler.core.trigger import parse_metadata
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.scaler.state.plan_book import observe
from gpuscale.stream.records import PodRecord
from gpuscale.telemetry.model import Reading

_SELECTOR = parse_selector("app=llm")


class PlannerPolicy:
    """A Signal (``__call__``) and a per-second observer (``tick``) for ``run_policy``."""

    def __init__(self, metadata: Mapping[str, str]) -> None:
        cfg = parse_metadata({"podSelector": "app=llm", "profile": "vllm-planner",
                              **metadata})
        assert cfg.planner is not None
        self.target = cfg.targets[0].target
        self.planner = Planner(cfg.planner)
        # replica (by identity) -> (time, prompt tokens, generated tokens, finished)
        self._counters: dict[int, tuple[float, float, float, float]] = {}

    def tick(self, model: ServingModel, now: float) -> None:
        view = FleetView(monotonic=lambda: now)
        records = []
        seen: dict[int, tuple[float, float, float, float]] = {}
        for i, (rep, s) in enumerate(zip(model.replicas, model.signals(now), strict=True)):
            signals: dict[str, Reading] = {}
            if s.ready:
                counters = (now, s.prompt_tokens_total, s.generation_tokens_total,
                            s.finished_total)
                seen[id(rep)] = counters
                before = self._counters.get(id(rep))
                signals = {"vllm-waiting": s.waiting, "vllm-running": float(s.running),
                           "vllm-kv-cache": s.kv_cache}
                if before is not None and now > before[0]:
                    # (the first scrape of a counter gives no rate: like the scaler, the
                    # observation then fails and the planner keeps its last plan)
                    dt = now - before[0]
                    signals.update({
                        "vllm-prompt-tps": (counters[1] - before[1]) / dt,
                        "vllm-generation-tps": (counters[2] - before[2]) / dt,
                        "vllm-finished-rate": (counters[3] - before[3]) / dt})
            records.append(PodRecord("sim", f"llm-{i}", "node", {"app": "llm"}, None,
                                     s.ready, signals, now))
        self._counters = seen
        view.update_node("node", records)
        try:
            self.planner.observe(now, observe(view, view.select("sim", _SELECTOR), []))
        except DataUnavailable as exc:
            self.planner.fail(now, str(exc))

    def __call__(self, model: ServingModel, now: float) -> list[Metric]:
        try:
            value: float | None = self.planner.current(now).replicas * self.target
        except PlanUnavailable:
            value = None  # the HPA keeps the current count; KEDA counts a failure
        return [Metric(MetricSource.EXTERNAL, TargetType.AVERAGE_VALUE, self.target, value)]


def planner_policy(params: ServingParams, slo_s: float = 2.0,
                   **metadata: str) -> dict[str, Any]:
    """``run_policy`` keyword arguments for the planner as the README configures it: its
    value as the HPA's signal, the per-second observation through the decider hook (which
    never decides), and the HPA's scale-down stabilization at 0 s (the planner holds its
    plan for a start-up itself; the HPA's 300 s on top only bills idle replicas)."""
    policy = PlannerPolicy({**planner_metadata(params, slo_s), **metadata})

    def tick(model: ServingModel, now: float, replicas: int) -> int | None:
        policy.tick(model, now)
        return None  # the HPA decides, on the planner's value
    return {"signal": policy, "decider": tick,
            "scale_down": replace(SCALE_DOWN, stabilization_s=0.0)}
