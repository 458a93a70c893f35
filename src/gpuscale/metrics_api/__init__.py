"""custom.metrics.k8s.io for a plain HPA: the fleet view served through the aggregation
layer (discovery, pod and object metrics, front-proxy authentication, delegated
authorization)."""
