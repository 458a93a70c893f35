"""The node agent: sampler loop, Prometheus exposition, health endpoints."""
