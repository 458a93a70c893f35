"""What the scaler's device history records: live nodes only, by node name."""

from __future__ import annotations

from gpuscale.scaler.answers import Answers
from gpuscale.scaler.edges.inspect import Inspector
from gpuscale.scaler.edges.keda import ScalerService
from gpuscale.scaler.recorder import Recorder
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.stream.records import DeviceRecord
from gpuscale.stream.subscriber import LinkState
from tests.support.clock import Clock


def test_a_silent_agents_last_readings_are_not_recorded(clock: Clock,
                                                         fleet: FleetView) -> None:
    gpu = DeviceRecord("GPU-1", 0, "NVIDIA L4", utilization=3.0, pods=("dev/a",))
    fleet.update_node("10.0.0.1:9401", [], [gpu])
    fleet.update_node("10.0.0.2:9401", [], [DeviceRecord("GPU-2", 0, "NVIDIA L4")])
    links = [LinkState("10.0.0.1:9401", expected_node="gpu-node-1"),
             LinkState("10.0.0.2:9401")]
    service = ScalerService(Answers(fleet))
    inspector = Inspector(Recorder(service.answers, service.history, links=lambda: links,
                                   wall=lambda: 6000.0))
    # Named by the node where the links know it, by the address where they do not.
    assert set(inspector.recorder.live_devices()) == {"gpu-node-1", "10.0.0.2:9401"}
    clock.now += 2.0
    fleet.update_node("10.0.0.2:9401", [], [DeviceRecord("GPU-2", 0, "NVIDIA L4")])
    clock.now += 2.0  # node 1 silent past the 3 s staleness bound: absent, not repeated
    assert set(inspector.recorder.live_devices()) == {"10.0.0.2:9401"}
