"""The KEDA external scaler: metadata, profiles, signals, fleet view, gRPC service."""

# Here, not in service.py, so that the command line can show it without importing the
# gRPC service (and grpcio's health and reflection modules) into every command: the node
# agent is one.
DEFAULT_PORT = 6000
