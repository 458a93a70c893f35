"""Every Kubernetes API call gpuscale makes, per component, in one place.

The RBAC in deploy/ grants exactly these and nothing else; a test compares the rendered
roles with this table. When code starts calling something new, add it here first.
"""

from __future__ import annotations

# (apiGroup, resource, verbs), cluster-wide unless noted
AGENT: frozenset[tuple[str, str, frozenset[str]]] = frozenset({
    ("", "pods", frozenset({"list", "watch"})),  # node pod cache (field selector: the node)
    ("apps", "replicasets", frozenset({"get"})),  # owner chain -> Deployment
    ("batch", "jobs", frozenset({"get"})),  # owner chain -> CronJob
    # DRA: which GPU a claim's device is (field selector: the node; attribution/slices.py)
    ("resource.k8s.io", "resourceslices", frozenset({"list", "watch"})),
})

SCALER: frozenset[tuple[str, str, frozenset[str]]] = frozenset({
    ("", "pods", frozenset({"list", "watch"})),  # the roster: running pods (status.phase)
    ("keda.sh", "scaledobjects", frozenset({"list", "watch"})),  # scaleTargetRef
    ("apps", "deployments", frozenset({"list", "watch"})),  # targets' selectors
    ("apps", "statefulsets", frozenset({"list", "watch"})),
    ("*", "*/scale", frozenset({"get"})),  # other scalables' selectors
})

# Namespaced (the release namespace): agent discovery.
SCALER_NAMESPACED: frozenset[tuple[str, str, frozenset[str]]] = frozenset({
    ("discovery.k8s.io", "endpointslices", frozenset({"list", "watch"})),
})

# The metrics API (--metrics-api-port), on top of SCALER. deploy/ grants these by binding the
# scaler's ServiceAccount to Kubernetes' built-in roles made for aggregated API servers, not
# with rules of its own (overlays/metrics-api, Helm metricsApi.enabled):
# Cluster-wide, through ClusterRole system:auth-delegator.
METRICS_API: frozenset[tuple[str, str, frozenset[str]]] = frozenset({
    # every request is authorized by the cluster (answers cached briefly)
    ("authorization.k8s.io", "subjectaccessreviews", frozenset({"create"})),
})

# In kube-system, through Role kube-system/extension-apiserver-authentication-reader.
METRICS_API_KUBE_SYSTEM: frozenset[tuple[str, str, frozenset[str]]] = frozenset({
    # extension-apiserver-authentication: the front proxy's CA and names, re-read every 60 s
    ("", "configmaps", frozenset({"get"})),
})
