"""Feed the fleet view from agents in the same process (the demo, and single-node use).

The fleet issue adds the same feed over each agent's telemetry stream.
"""

from __future__ import annotations

from gpuscale.agent.app import Agent
from gpuscale.attribution.model import AttributionState, NodeAttribution
from gpuscale.scaler.fleet import FleetView, pod_records
from gpuscale.telemetry.model import BackendState, NodeSnapshot


def feed(agent: Agent, fleet: FleetView) -> None:
    """After each of the agent's ticks, replace its node's pods in the fleet view.

    A tick without usable attribution or GPU readings leaves the node's previous records in
    place: they age, and the workloads on that node turn UNAVAILABLE once past the staleness
    bound - never a smaller sum.
    """

    def on_tick(snap: NodeSnapshot, att: NodeAttribution | None) -> None:
        if snap.state is not BackendState.OK or att is None:
            return
        if att.state is AttributionState.UNAVAILABLE:
            return
        fleet.update_node(snap.node, pod_records(snap, att, sampled_at=snap.monotonic,
                                                 engines=agent.engine_signals()))

    agent.sampler.add_listener(on_tick)
