"""Spare replicas while a scale-up starts (the planner's ``spareReplicas``, default 0): a
hedge against a long cold start.

A new replica's start-up has a long tail (a node pulling the image, weights loading from
busy storage): the plan asks a replica a start-up before it is needed, and one that draws
the tail arrives late however early it was asked. With ``spare_replicas`` = s, while the
plan needs more replicas than are Ready it asks s more; the first to become Ready serve,
and once the plan's count is Ready the ask drops back and the HPA's scale-down takes the
rest - the ReplicaSet deletes pods that are not Ready first (then the youngest), so a
spare still starting goes before any pod that serves. What a spare costs is its GPU time
until the replicas the plan needs are Ready: once per scale-up, while it starts.

Not while the planner is warming (it then keeps every pod that exists, which would hold
the spare), and only ever added: a spare never lowers a plan, and the hold and the drain
floor see the plan without it.

With the start-up measured (no ``startupSeconds``), the pods that become Ready are the
faster of each race, so the look-ahead measured is the hedged start-up's - the one the
plan gets while spares are asked (give ``startupSeconds`` to plan for the unhedged one).

Where it pays: start-ups that vary from pod to pod. Where a slow start is the cluster's
(no GPU node free, every pod waiting on a node to be provisioned), a spare is one more
pod waiting - and with a cluster autoscaler, possibly one more node asked for.
"""

from __future__ import annotations

MAX_SPARE = 10  # the trigger's bound on spareReplicas


def spare(spare_replicas: int, planned: int, ready: int, warming: bool) -> int:
    """Replicas to ask beyond ``planned``: ``spare_replicas`` while fewer than ``planned``
    are Ready (a scale-up under way), else 0."""
    if spare_replicas <= 0 or warming or planned <= ready:
        return 0
    return spare_replicas
