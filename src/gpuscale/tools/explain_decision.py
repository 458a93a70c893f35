"""What ``explain`` concludes a scaler (KEDA and the HPA, or a plain HPA) does now: one
value both deciders (tools.explain, tools.explain_hpa) fill."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Decision:
    current: int
    current_from: str  # where the current count came from
    desired: int
    active: bool | None  # None: cannot be known (UNAVAILABLE)
    lines: list[str] = field(default_factory=list)  # the reasoning, a line each
