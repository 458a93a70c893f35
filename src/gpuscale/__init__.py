"""gpuscale: GPU-aware autoscaling signals for Kubernetes."""

__version__ = "0.1.0"
