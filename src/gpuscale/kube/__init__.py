"""Kubernetes API plumbing shared by the agent and the scaler."""
