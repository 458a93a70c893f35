"""The bottom layer: the error hierarchy and small helpers every layer may use (bounded
HTTP reads, gRPC port binding, graceful stop)."""
