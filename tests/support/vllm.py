"""vLLM pods as an agent's records carry them, for the planner's tests."""

from __future__ import annotations

from gpuscale.stream.records import PodRecord
from gpuscale.telemetry.model import Reading


def vllm_pod(name: str, busy: float, *, at: float, ready: bool = True,
             waiting: float = 0.0, app: str = "vllm", node: str = "node-a",
             override: dict[str, Reading] | None = None) -> PodRecord:
    """A vLLM pod in namespace llm doing ``busy`` replica-seconds of work per second (half
    prefill at 30,000 prompt tokens/s, half decode at 12,000 tokens/s); a pod that is not
    Ready has no readings yet."""
    signals: dict[str, Reading] = {
        "vllm-prompt-tps": busy / 2 * 30_000, "vllm-generation-tps": busy / 2 * 12_000,
        "vllm-finished-rate": 0.0, "vllm-waiting": waiting, "vllm-running": 10.0,
        "vllm-kv-cache": 20.0, **(override or {})}
    return PodRecord("llm", name, node, {"app": app}, None, ready, signals if ready else {},
                     at)
