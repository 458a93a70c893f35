"""What the relay tests ask through KEDA's port: one ScaledObject (``REF``, pods app=vllm in
llm) and its pods' records."""

from __future__ import annotations

from gpuscale.proto import externalscaler_pb2 as pb
from gpuscale.stream.records import PodRecord


def rec(name: str, util: float, at: float = 1000.0) -> PodRecord:
    return PodRecord("llm", name, "node-a", {"app": "vllm"}, None, True,
                     {"gpu-utilization": util}, at)


REF = pb.ScaledObjectRef(name="so", namespace="llm", scalerMetadata={"podSelector": "app=vllm"})
