"""The operator tools: ``gpuscale explain``, ``top`` and ``idle`` over a running scaler's
read-only Inspect service, ``generate`` (a ScaledObject from a workload), and what they
make of their replies."""
