"""Feed the fleet view from agents in the same process (the demo, and single-node use).

Scaler replicas in a cluster get the same records over each agent's telemetry stream
(gpuscale.fleet).
"""

from __future__ import annotations

from gpuscale.agent.app import Agent
from gpuscale.attribution.model import NodeAttribution
from gpuscale.scaler.fleet import FleetView
from gpuscale.telemetry.model import NodeSnapshot


def feed(agent: Agent, fleet: FleetView) -> None:
    """After each of the agent's ticks, replace its node's pods in the fleet view.

    A tick without usable attribution or GPU readings leaves the node's previous records in
    place: they age, and the workloads on that node turn UNAVAILABLE once past the staleness
    bound - never a smaller sum.
    """

    def on_tick(snap: NodeSnapshot, att: NodeAttribution | None) -> None:
        records = agent.pod_records(snap, att)
        if records is not None:
            fleet.update_node(snap.node, records)

    agent.sampler.add_listener(on_tick)
