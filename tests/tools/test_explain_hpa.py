"""gpuscale explain for a workload a plain HPA reads through the metrics API (pure): the
HPA's arithmetic alone, its wording, and what the scaler cannot know said, not assumed
silently."""

from __future__ import annotations

import pytest

from gpuscale.proto import inspect_pb2 as pb
from gpuscale.tools.explain import decide, render

NOW = 1_800_000_000.0


def hpa_reply(value: float, pods: int = 2, unavailable: str = "",
              signal: str = "planned-replicas", replicas: int = -1) -> pb.ExplainReply:
    r = pb.ExplainReply(now=NOW, namespace="llm", name="Deployment/vllm", value_mode="sum",
                        pod_count=pods, planned_replicas=-1, source="metrics-api",
                        selector="app=vllm")
    r.metadata.update({"profile": "vllm-planner", "startupSeconds": "100"}
                      if signal == "planned-replicas" else
                      {"signal": signal, "targetValue": "1"})
    r.answers.add(metric_name=f"gpuscale-{signal}", signal=signal, target=1.0, value=value,
                  counted=pods, ready=pods, unavailable=unavailable)
    r.scale_target.CopyFrom(pb.ScaleTarget(kind="Deployment", name="vllm", replicas=replicas))
    return r


@pytest.mark.parametrize(("value", "current", "bounds", "desired"), [
    (12.0, 2, (None, None), 6),  # scale-up limit per 15 s: max(2 x 100 %, 2 + 4 pods)
    (5.0, 4, (None, None), 5),
    (1.0, 4, (None, None), 1),  # no window: the planner holds its own plan
    (20.0, 6, (1, 8), 8),
    (0.0, 3, (2, 8), 2),
])
def test_the_hpa_alone_decides(value: float, current: int,
                               bounds: tuple[int | None, int | None], desired: int) -> None:
    d = decide(hpa_reply(value, pods=current), None, bounds)
    assert (d.current, d.desired) == (current, desired)
    text = render(hpa_reply(value, pods=current), d)
    assert text.splitlines()[0] == ("Deployment llm/vllm (read by an HPA through "
                                    "custom.metrics.k8s.io)")
    for keda in ("KEDA", "ScaledObject", "activation", "cooldown", "fallback"):
        assert keda not in text
    assert "metric    gpuscale_planned_replicas, selector startupSeconds=100" in text
    if bounds == (None, None):
        assert "max none (the HPA's, not known to this scaler" in text


def test_the_workloads_own_replica_count_is_current_when_the_scaler_watches_it() -> None:
    d = decide(hpa_reply(3.0, pods=2, replicas=3))
    assert (d.current, d.current_from) == (3, "Deployment vllm's spec.replicas")


def test_a_503_is_a_metric_the_hpa_cannot_read() -> None:
    d = decide(hpa_reply(0.0, pods=3, unavailable="llm/vllm-1: stale"), None, (1, 8))
    assert d.desired == 3
    assert any("503 to the HPA (llm/vllm-1: stale)" in line for line in d.lines)
    assert any("no metric could be read" in line for line in d.lines)


def test_a_plain_metrics_target_is_the_hpas_and_not_guessed() -> None:
    d = decide(hpa_reply(140.0, pods=2, signal="gpu-utilization"), None, (1, 8))
    assert d.desired == 2
    assert any("not known here" in line for line in d.lines)
    assert "gpuscale_gpu_utilization: 140" in render(
        hpa_reply(140.0, signal="gpu-utilization"), d)
