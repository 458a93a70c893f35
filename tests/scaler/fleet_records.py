"""What agents report to the scaler, for the Inspect tests: a vLLM pod's record and a MIG
node's devices (an H100 split into MIG, one 3g.40gb instance held by the given pods)."""

from __future__ import annotations

from gpuscale.attribution.model import OwnerRef
from gpuscale.stream.records import DeviceRecord, PodRecord
from gpuscale.telemetry.model import Absent, Reading

GPU = "GPU-00000000-0000-0000-0000-000000000000"
MIG = "MIG-11111111-1111-1111-1111-111111111111"


def rec(name: str, util: Reading, *, ns: str = "llm", node: str = "node-a",
        at: float = 1000.0, ready: bool = True) -> PodRecord:
    return PodRecord(ns, name, node, {"app": "vllm"}, OwnerRef("Deployment", "vllm"), ready,
                     {"gpu-utilization": util}, at)


def devices(*holders: str) -> list[DeviceRecord]:
    return [DeviceRecord(GPU, 0, "NVIDIA H100 80GB HBM3", sharing="mig",
                         utilization=Absent.UNSUPPORTED, memory_used_mib=1000.0,
                         memory_total_mib=81559.0),
            DeviceRecord(MIG, 0, "3g.40gb", GPU, "exclusive", 60.0, 500.0, 40192.0,
                         tuple(holders))]
