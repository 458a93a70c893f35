"""Agent -> scaler telemetry: the stream codec, the agent's publisher, the scaler's subscribers."""
