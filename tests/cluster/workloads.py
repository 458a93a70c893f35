"""The objects the scenarios apply: an inference Deployment on the simulated GPU nodes
and the ScaledObject a user writes for it (README's form)."""

from __future__ import annotations

from typing import Any

NAMESPACE = "llm"
SCALER = "gpuscale-scaler.gpuscale.svc:6000"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
WHOLE_GPU_NODES = {"key": "kubernetes.io/hostname", "operator": "In",
                   "values": ["kwok-gpu-0", "kwok-gpu-1"]}


def namespace(name: str = NAMESPACE) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def inference_deployment(name: str, replicas: int = 1, ready_after: str = "3s",
                         batch: int = 16) -> dict[str, Any]:
    """vLLM replicas holding one whole GPU each; the stand-in kubelet serves their
    engines' /metrics on port 8000 once Ready (after ``ready_after``)."""
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}, "annotations": {
                    "gpuscale.io/engine": "vllm", "gpuscale.io/metrics-port": "8000",
                    "gpuscale.io/sim-ready-after": ready_after,
                    "gpuscale.io/sim-batch": str(batch)}},
                "spec": {
                    "nodeSelector": {"nvidia.com/gpu.present": "true"},
                    "affinity": {"nodeAffinity": {REQUIRED: {
                        "nodeSelectorTerms": [{"matchExpressions": [WHOLE_GPU_NODES]}]}}},
                    "containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0",
                                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            },
        },
    }


def scaled_object(name: str, target: str, *, signal: str = "vllm-requests",
                  target_value: str = "8", min_replicas: int = 1, max_replicas: int = 8,
                  polling: int = 5, cooldown: int = 30, push: bool = False,
                  extra: dict[str, str] | None = None,
                  fallback: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "scaleTargetRef": {"name": target},
        "minReplicaCount": min_replicas, "maxReplicaCount": max_replicas,
        "pollingInterval": polling, "cooldownPeriod": cooldown,
        "advanced": {"horizontalPodAutoscalerConfig": {
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}}}},
        "triggers": [{"type": "external-push" if push else "external", "metadata": {
            "scalerAddress": SCALER, "podSelector": f"app={target}", "signal": signal,
            "targetValue": target_value, **(extra or {})}}],
    }
    if fallback is not None:
        spec["fallback"] = fallback
    return {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
            "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec}
