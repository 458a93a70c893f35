"""Objects as the test API server (tests/peers/kubeapi.py) stores and returns them: pods with
what the kubelet writes, Deployments and StatefulSets, KEDA ScaledObjects, EndpointSlices,
and the Status objects the real server answers failures with."""

from __future__ import annotations

from typing import Any

CREATED = "2026-11-26T08:00:00Z"  # make_pod's creationTimestamp unless given


def make_pod(ns: str, name: str, uid: str, node: str = "node-a", *,
             owner: tuple[str, str] | None = None, ready: bool = True, ip: str = "10.0.0.1",
             containers: tuple[tuple[str, str], ...] = (("main", "c" * 64),),
             labels: dict[str, str] | None = None, phase: str = "Running",
             created: str = CREATED, ready_since: str = "2026-11-26T08:02:30Z",
             restarts: int = 0) -> dict[str, Any]:
    """A pod as the API server returns it: the kubelet's Ready condition with its last
    transition (``ready_since``), each container's restart count."""
    meta: dict[str, Any] = {"namespace": ns, "name": name, "uid": uid,
                            "labels": labels or {"app": name}, "creationTimestamp": created}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner[0],
                                    "name": owner[1], "uid": "o-" + owner[1],
                                    "controller": True}]
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"nodeName": node},
        "status": {"phase": phase, "podIP": ip,
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                                   "lastProbeTime": None, "lastTransitionTime": ready_since}],
                   "containerStatuses": [{"name": c, "containerID": f"containerd://{cid}",
                                          "ready": ready, "restartCount": restarts}
                                         for c, cid in containers]}}


def status(code: int, reason: str, message: str,
           metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    """A failure as the API server says it (``kind: Status``)."""
    return {"kind": "Status", "apiVersion": "v1", "metadata": metadata or {},
            "status": "Failure", "message": message, "reason": reason, "code": code}


def make_workload(kind: str, ns: str, name: str, match_labels: dict[str, str],
                  expressions: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    selector: dict[str, Any] = {"matchLabels": match_labels}
    if expressions:
        selector["matchExpressions"] = expressions
    return {"apiVersion": "apps/v1", "kind": kind,
            "metadata": {"namespace": ns, "name": name, "uid": f"uid-{kind}-{ns}-{name}"},
            "spec": {"selector": selector, "replicas": 2}}


def make_scaledobject(ns: str, name: str, target: str, kind: str = "Deployment",
                      api_version: str = "apps/v1") -> dict[str, Any]:
    return {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
            "metadata": {"namespace": ns, "name": name, "uid": f"uid-so-{ns}-{name}"},
            "spec": {"scaleTargetRef": {"name": target, "kind": kind,
                                        "apiVersion": api_version},
                     "triggers": [{"type": "external", "metadata": {}}]}}


def make_endpointslice(service: str, name: str, endpoints: list[tuple[str, bool]],
                       port: int | None = None,
                       nodes: list[str] | None = None) -> dict[str, Any]:
    """An EndpointSlice of ``service`` with (ip, ready) endpoints; ``nodes``: each
    endpoint's nodeName (the EndpointSlice controller sets it from the pod)."""
    eps: list[dict[str, Any]] = [{"addresses": [ip], "conditions": {"ready": ready}}
                                 for ip, ready in endpoints]
    for ep, node in zip(eps, nodes or [], strict=False):
        ep["nodeName"] = node
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "addressType": "IPv4",
            "metadata": {"namespace": "gpuscale", "name": name, "uid": f"uid-eps-{name}",
                         "labels": {"kubernetes.io/service-name": service}},
            "ports": [{"name": "telemetry", "port": port, "protocol": "TCP"}] if port else [],
            "endpoints": eps}
