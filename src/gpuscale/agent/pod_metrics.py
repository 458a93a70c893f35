"""Per-pod exposition: native ``gpuscale_pod_*`` series and the attribution's state.

Rendered from the latest NodeAttribution on every scrape, like the device series. Pod
series are bounded (MAX_POD_SERIES); reasons are not labels (they are unbounded text):
/readyz carries them.
"""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily, Metric

from gpuscale.attribution.model import AttributionState, NodeAttribution
from gpuscale.telemetry.model import Absent

MAX_POD_SERIES = 512


def attribution_families(att: NodeAttribution) -> list[Metric]:
    """Native per-pod series and the attribution's own state."""
    pod_labels = ["namespace", "pod", "container", "resource"]
    util = GaugeMetricFamily("gpuscale_pod_gpu_utilization",
                             "Attributed GPU utilization of a pod container, in percent of "
                             "one GPU (two busy GPUs read 200).", labels=pod_labels)
    used = GaugeMetricFamily("gpuscale_pod_gpu_memory_used_bytes",
                             "GPU memory attributed to a pod container.", labels=pod_labels)
    total = GaugeMetricFamily("gpuscale_pod_gpu_memory_total_bytes",
                              "GPU memory of the devices a pod container holds.",
                              labels=pod_labels)
    devices = GaugeMetricFamily("gpuscale_pod_gpu_devices",
                                "Devices a pod container holds, by sharing mode and how "
                                "their load was split (exclusive, process, shared).",
                                labels=[*pod_labels, "sharing", "split", "sharers"])
    absent = GaugeMetricFamily("gpuscale_pod_gpu_reading_absent",
                               "1 when a pod container's reading has no value, with why.",
                               labels=[*pod_labels, "reading", "reason"])
    for p in att.pods[:MAX_POD_SERIES]:
        lv = [p.namespace, p.pod, p.container, p.resource]
        for fam, name, value in ((util, "utilization", p.utilization_percent),
                                 (used, "memory_used", p.memory_used_bytes),
                                 (total, "memory_total", p.memory_total_bytes)):
            if isinstance(value, Absent):
                absent.add_metric([*lv, name, value.value], 1.0)
            else:
                fam.add_metric(lv, float(value))
        kinds: dict[tuple[str, str, str], int] = {}
        for d in p.devices:
            k = (d.sharing.value, d.split.value, str(d.sharers))
            kinds[k] = kinds.get(k, 0) + 1
        for k, n in kinds.items():
            devices.add_metric([*lv, *k], float(n))
    idle = GaugeMetricFamily("gpuscale_gpu_unallocated",
                             "1 for each GPU or MIG instance that no pod holds: idle "
                             "capacity.", labels=["UUID"])
    for u in att.idle_gpus:
        idle.add_metric([u], 1.0)
    orphans = GaugeMetricFamily("gpuscale_gpu_unattributed_processes",
                                "GPU processes that belong to no pod that holds the GPU.",
                                labels=["UUID", "kind"])
    counts: dict[tuple[str, str], int] = {}
    for o in att.unattributed:
        counts[(o.gpu_uuid, o.kind)] = counts.get((o.gpu_uuid, o.kind), 0) + 1
    for (gpu, kind), n in counts.items():
        orphans.add_metric([gpu, kind], float(n))
    state = GaugeMetricFamily("gpuscale_agent_attribution_state",
                              "1 for the attribution's current state (ok, partial, "
                              "unavailable); /readyz gives the reasons.", labels=["state"])
    for st in AttributionState:
        state.add_metric([st.value], 1.0 if att.state is st else 0.0)
    return [util, used, total, devices, absent, idle, orphans, state]
