"""The KEDA external scaler: metadata, profiles, signals, fleet view, gRPC service."""
