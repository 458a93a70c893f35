"""What the scaler's device history records: live nodes only, by node name."""

from __future__ import annotations

import asyncio

from gpuscale.attribution.model import OwnerRef
from gpuscale.scaler.answers import Answers
from gpuscale.scaler.edges.inspect import Inspector
from gpuscale.scaler.edges.keda import ScalerService
from gpuscale.scaler.recorder import Recorder
from gpuscale.scaler.state.fleet import FleetView
from gpuscale.stream.records import DeviceRecord, PodRecord
from gpuscale.stream.subscriber import LinkState
from tests.support.clock import Clock
from tests.support.polling import until


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


async def test_the_running_recorder_names_each_holder_s_owner(clock: Clock,
                                                                fleet: FleetView) -> None:
    """Devices are sampled in slices while the scaler serves; each holder's owner is looked
    up then (a pod no node reports any more has none, not a guess)."""
    web = PodRecord("dev", "a", "n1", {}, OwnerRef("Deployment", "web"), True, {}, clock.now)
    batch = PodRecord("dev", "b", "n2", {}, None, True, {}, clock.now)
    fleet.update_node("10.0.0.1:9401", [web], [
        DeviceRecord("GPU-1", 0, "NVIDIA L4", utilization=3.0, pods=("dev/a", "dev/gone"))])
    fleet.update_node("10.0.0.2:9401", [batch], [
        DeviceRecord("GPU-2", 0, "NVIDIA L4", utilization=5.0, pods=("dev/b",))])
    service = ScalerService(Answers(fleet))
    recorder = Recorder(service.answers, service.history, wall=lambda: 6000.0)
    task = asyncio.create_task(recorder.run())
    try:
        await until(lambda: len(list(recorder.devices.logs(0.0))) == 2,
                    what="both devices recorded")
    finally:
        task.cancel()
    got = {uuid: (m[-1].pods, m[-1].owners) for uuid, _, m in recorder.devices.logs(0.0)}
    assert got == {"GPU-1": (("dev/a", "dev/gone"), ("Deployment/web", "")),
                   "GPU-2": (("dev/b",), ("",))}
