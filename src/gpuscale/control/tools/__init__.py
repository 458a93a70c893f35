"""The operator tools: ``gpuscale explain``, ``top`` and ``idle`` over a running scaler's
read-only Inspect service (scaler.inspect), and what they make of its replies."""
