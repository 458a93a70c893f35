"""The scaler's edges: KEDA's ExternalScaler and the read-only Inspect service over
gRPC, and /metrics, /healthz, /readyz over HTTP. Each answers through scaler.answers."""
