"""The KEDA external scaler, in layers (an import-linter contract holds them): ``core/``
pure (trigger metadata, selectors, signals and profiles, aggregation, the planner) ->
``state/`` (fleet view, plan book, pushes, history) -> ``sources/`` (rosters, workload
resolver, demand sources) -> ``answers`` (the one place a workload's value is computed) ->
``recorder`` -> ``edges/`` (KEDA's gRPC service, Inspect, HTTP) and ``config`` -> ``root``
(the ``Scaler`` that owns and runs them)."""

# Here, not in service.py, so that the command line can show it without importing the
# gRPC service (and grpcio's health and reflection modules) into every command: the node
# agent is one.
DEFAULT_PORT = 6000
