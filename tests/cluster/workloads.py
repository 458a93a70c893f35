"""The objects the scenarios apply: an inference Deployment on the simulated GPU nodes
(its GPU from the device plugin, or from a ResourceClaim on the DRA node) and the
ScaledObject a user writes for it (README's form)."""

from __future__ import annotations

from typing import Any

NAMESPACE = "llm"
SCALER = "gpuscale-scaler.gpuscale.svc:6000"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
WHOLE_GPU_NODES = {"key": "kubernetes.io/hostname", "operator": "In",
                   "values": ["kwok-gpu-0", "kwok-gpu-1"]}
DRA_NODES = {"key": "kubernetes.io/hostname", "operator": "In", "values": ["kwok-dra-0"]}
CLAIM_TEMPLATE = "one-gpu"


def namespace(name: str = NAMESPACE) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def gpu_claim_template(name: str = CLAIM_TEMPLATE) -> dict[str, Any]:
    """One whole GPU of NVIDIA's DRA driver's device class, a claim per pod."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.nvidia.com", "count": 1}}]}}}}


def inference_deployment(name: str, replicas: int = 1, ready_after: str = "3s",
                         batch: int = 16, dra: bool = False) -> dict[str, Any]:
    """vLLM replicas holding one whole GPU each (``dra``: through a claim from
    ``gpu_claim_template``, on the DRA node); the stand-in kubelet serves their engines'
    /metrics on port 8000 once Ready (after ``ready_after``)."""
    container: dict[str, Any] = {"name": "vllm", "image": "vllm/vllm-openai:v0.11.0",
                                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    claims: dict[str, Any] = {}
    if dra:
        container["resources"] = {"claims": [{"name": "gpu"}]}
        claims = {"resourceClaims": [{"name": "gpu",
                                      "resourceClaimTemplateName": CLAIM_TEMPLATE}]}
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
                    "affinity": {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{
                        "matchExpressions": [DRA_NODES if dra else WHOLE_GPU_NODES]}]}}},
                    **claims, "containers": [container]},
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
