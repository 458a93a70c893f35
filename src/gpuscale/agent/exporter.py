"""Prometheus exposition of the latest snapshot: dcgm-exporter-compatible and native series.

The collector keeps no per-series state: every scrape renders fresh families from the
latest snapshot, so series of GPUs, MIG instances or processes that vanished simply stop.
A reading that is ``Absent`` produces no sample (never 0); instead
``gpuscale_gpu_reading_absent{reading, reason}`` says which reading is missing and why.

Compatibility with dcgm-exporter: same series names, units and labels (``gpu, UUID,
pci_bus_id, device, modelName, Hostname``, plus ``GPU_I_PROFILE, GPU_I_ID`` on MIG
instances). Two documented differences: ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` is typed
gauge (prometheus_client only types ``*_total`` names as counters; the values are the same
monotonic millijoules, and ``rate()`` works on it), and on MIG-enabled GPUs framebuffer
series are emitted per instance only, so ``sum(DCGM_FI_DEV_FB_USED)`` does not count twice.

AMD GPUs (the ``amdsmi`` backend): the series of AMD's device metrics exporter that people
already query - ``gpu_gfx_activity``, ``gpu_umc_activity``, ``gpu_used_vram``,
``gpu_total_vram``, ``gpu_free_vram`` (MiB), ``gpu_package_power`` (W),
``gpu_junction_temperature`` (C) - with its labels ``gpu_id, gpu_partition_id,
card_model, hostname`` (and ``pod, namespace, container`` of the holders), and of the
dcgm-exporter series only those whose meaning is the same: ``DCGM_FI_DEV_GPU_UTIL`` (the
graphics/compute engine's busy percentage), ``DCGM_FI_DEV_FB_USED``/``FREE`` (VRAM) and
``DCGM_FI_DEV_POWER_USAGE``, with ``device="amdgpu<N>"`` - not ``DCGM_FI_DEV_GPU_TEMP`` (an
edge temperature; the MI300's is the hotspot) nor the copy-engine or clock series. A
partitioned AMD GPU is, as in AMD's exporter, one ``gpu_id`` per partition (numbered as
amdsmi enumerates them), labelled ``gpu_partition_id`` and
``gpu_compute_partition_type``/``gpu_memory_partition_type``: VRAM per partition; the
GPU's activity, power and temperature on its partition 0 only (the physical GPU's, as
AMD's exporter gives them); each partition's own busy share is
``gpuscale_mig_utilization_percent`` and ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (the MIG
series, ``GPU_I_PROFILE="cpx.nps1"``, ``GPU_I_ID`` the partition).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuscale.agent.pod_metrics import attribution_families
from gpuscale.attribution.model import NodeAttribution
from gpuscale.telemetry.model import (
    Absent,
    BackendState,
    GpuSample,
    GpuState,
    IntReading,
    MigSample,
    NodeSnapshot,
    ProcessSample,
)

MIB = 1024 * 1024
MAX_PROCESS_SERIES_PER_GPU = 64  # bounded label cardinality: the busiest by memory win

DCGM_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname")
AMD_BACKEND = "amdsmi"


@dataclass
class _Family:
    """One family filled from readings; Absent readings are skipped.

    Samples of one family may carry different label sets (MIG instances add
    ``GPU_I_PROFILE, GPU_I_ID`` to the device labels), as dcgm-exporter's output does.
    """

    name: str
    help: str
    scale: float = 1.0
    counter: bool = False
    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)

    def add(self, labels: dict[str, str], value: float | Absent) -> None:
        if not isinstance(value, Absent):
            self.samples.append((labels, float(value) * self.scale))

    def build(self) -> Metric:
        fam = Metric(self.name, self.help, "counter" if self.counter else "gauge")
        sample_name = f"{self.name}_total" if self.counter else self.name
        for labels, value in self.samples:
            fam.add_sample(sample_name, labels, value)
        return fam


class SnapshotCollector(Collector):
    """Renders ``source()`` (the sampler's latest snapshot) on every scrape."""

    def __init__(self, source: Callable[[], NodeSnapshot | None], hostname: str,
                 monotonic: Callable[[], float] = time.monotonic,
                 attribution: Callable[[], NodeAttribution | None] = lambda: None) -> None:
        self._source = source
        self._hostname = hostname
        self._monotonic = monotonic
        self._attribution = attribution

    def describe(self) -> Iterable[Metric]:
        return []  # families vary with the snapshot; describe nothing so none is pre-checked

    def collect(self) -> Iterable[Metric]:
        snap = self._source()
        up = GaugeMetricFamily("gpuscale_agent_backend_up",
                               "1 when the GPU backend could read the GPUs in the last sample.",
                               labels=["backend"])
        if snap is None:
            return [up]
        up.add_metric([snap.backend], 1.0 if snap.state is BackendState.OK else 0.0)
        age = GaugeMetricFamily("gpuscale_agent_snapshot_age_seconds",
                                "Seconds since the latest published sample was taken.")
        age.add_metric([], max(0.0, self._monotonic() - snap.monotonic))
        last = GaugeMetricFamily("gpuscale_agent_last_sample_timestamp_seconds",
                                 "Wall-clock time of the latest sample.")
        last.add_metric([], snap.taken_at)
        count = GaugeMetricFamily("gpuscale_agent_gpus", "GPUs the backend sees on this node.")
        count.add_metric([], float(len(snap.gpus)))
        att = self._attribution()
        return [up, age, last, count, *self._gpu_families(snap, att),
                *(attribution_families(att) if att is not None else [])]

    def _gpu_families(self, snap: NodeSnapshot, att: NodeAttribution | None) -> list[Metric]:
        f = {name: _Family(name, help_, scale, counter)
             for name, help_, scale, counter in _FAMILIES}
        info = GaugeMetricFamily(
            "gpuscale_gpu_info", "Static facts about each GPU (value 1).",
            labels=[*DCGM_LABELS, "driver_version", "sharing", "mig_enabled", "state"])
        holders = _holders(att)
        absent = GaugeMetricFamily(
            "gpuscale_gpu_reading_absent",
            "1 for each reading that has no value, with the reason (unsupported, "
            "unavailable, lost, no_data).",
            labels=["gpu", "UUID", "GPU_I_ID", "reading", "reason"])
        amd = snap.backend == AMD_BACKEND
        amd_id = 0  # AMD's gpu_id: the processors as amdsmi enumerates them
        for g in snap.gpus:
            dl = {"gpu": str(g.index), "UUID": g.uuid, "pci_bus_id": g.pci_bus_id,
                  "device": f"amdgpu{g.index}" if amd else f"nvidia{g.minor_number}",
                  "modelName": g.name, "Hostname": self._hostname}
            info.add_metric([*dl.values(), snap.driver_version, g.sharing.value,
                             str(g.mig_enabled).lower(), g.state.value], 1.0)
            f["gpuscale_gpu_up"].add(dl, 1.0 if g.state is GpuState.OK else 0.0)
            # dcgm-exporter's way: device series carry the holder's pod labels, one series
            # per holder on shared GPUs; unheld devices keep the bare labels.
            for labels in _with_pods(dl, holders.get(g.uuid, []), g.mig_enabled):
                if amd:
                    self._amd_dcgm_gpu(f, labels, g)
                else:
                    self._dcgm_gpu(f, labels, g)
            if amd:
                amd_id = self._amd_gpu(f, g, amd_id, holders)
            self._gpu(f, dl, g)
            for name, value in _readings(g):
                if isinstance(value, Absent):
                    absent.add_metric([str(g.index), g.uuid, "", name, value.value], 1.0)
            for m in g.migs:
                ml = {**dl, "GPU_I_PROFILE": m.profile, "GPU_I_ID": str(m.gpu_instance_id)}
                for labels in _with_pods(ml, holders.get(m.uuid, []), False):
                    self._dcgm_mig(f, labels, m)
                self._mig(f, ml, m)
                if isinstance(m.utilization_percent, Absent):
                    absent.add_metric([str(g.index), g.uuid, str(m.gpu_instance_id),
                                       "utilization", m.utilization_percent.value], 1.0)
            self._processes(f, dl, g)
        return [info, absent, *(fam.build() for fam in f.values())]

    @staticmethod
    def _dcgm_gpu(f: dict[str, _Family], dl: dict[str, str], g: GpuSample) -> None:
        f["DCGM_FI_DEV_GPU_UTIL"].add(dl, g.utilization_percent)
        f["DCGM_FI_DEV_MEM_COPY_UTIL"].add(dl, g.memory_util_percent)
        if not g.mig_enabled:
            f["DCGM_FI_DEV_FB_USED"].add(dl, g.memory_used_bytes)
            f["DCGM_FI_DEV_FB_FREE"].add(dl, g.memory_free_bytes)
            f["DCGM_FI_DEV_FB_RESERVED"].add(dl, g.memory_reserved_bytes)
        f["DCGM_FI_DEV_POWER_USAGE"].add(dl, g.power_watts)
        f["DCGM_FI_DEV_GPU_TEMP"].add(dl, g.temperature_c)
        f["DCGM_FI_DEV_SM_CLOCK"].add(dl, g.sm_clock_mhz)
        f["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].add(dl, g.energy_millijoules)
        if g.state is not GpuState.LOST:
            f["DCGM_FI_DEV_XID_ERRORS"].add(dl, float(g.last_xid))

    @staticmethod
    def _amd_dcgm_gpu(f: dict[str, _Family], dl: dict[str, str], g: GpuSample) -> None:
        """The dcgm-exporter series whose meaning is the same on an AMD GPU. A partitioned
        one is a MIG GPU to them: no device utilization (its average over partitions would
        call a GPU with one busy partition idle) and VRAM per partition (a sum counts it
        once); each partition's busy share is its DCGM_FI_PROF_GR_ENGINE_ACTIVE."""
        if not g.mig_enabled:
            f["DCGM_FI_DEV_GPU_UTIL"].add(dl, g.utilization_percent)
            f["DCGM_FI_DEV_FB_USED"].add(dl, g.memory_used_bytes)
            f["DCGM_FI_DEV_FB_FREE"].add(dl, g.memory_free_bytes)
        f["DCGM_FI_DEV_POWER_USAGE"].add(dl, g.power_watts)

    def _amd_gpu(self, f: dict[str, _Family], g: GpuSample, first_id: int,
                 holders: dict[str, list[Holder]]) -> int:
        """AMD's device metrics exporter's series, with its labels: one gpu_id per
        partition the library enumerates. Returns the next gpu_id."""
        base = {"card_model": g.name, "hostname": self._hostname}
        if not g.migs:
            al = {"gpu_id": str(first_id), "gpu_partition_id": "0", **base}
            for labels in _with_pods(al, holders.get(g.uuid, []), False):
                _amd_physical(f, labels, g)
                _amd_vram(f, labels, g.memory_used_bytes, g.memory_total_bytes)
            return first_id + 1
        for i, m in enumerate(g.migs):
            compute, _, memory = m.profile.partition(".")
            al = {"gpu_id": str(first_id + i), "gpu_partition_id": str(m.gpu_instance_id),
                  "gpu_compute_partition_type": compute,
                  "gpu_memory_partition_type": memory, **base}
            if i == 0:  # the physical GPU's readings, on its first partition - and no
                _amd_physical(f, al, g)  # pod's: its partition's share is not the GPU's
            for labels in _with_pods(al, holders.get(m.uuid, []), False):
                _amd_vram(f, labels, m.memory_used_bytes, m.memory_total_bytes)
        return first_id + len(g.migs)

    @staticmethod
    def _gpu(f: dict[str, _Family], dl: dict[str, str], g: GpuSample) -> None:
        f["gpuscale_gpu_xid_errors"].add(dl, float(g.xid_errors_total))
        f["gpuscale_gpu_utilization_percent"].add(dl, g.utilization_percent)
        if g.utilization_samples:
            f["gpuscale_gpu_utilization_samples"].add(dl, float(g.utilization_samples))
        f["gpuscale_gpu_memory_used_bytes"].add(dl, g.memory_used_bytes)
        f["gpuscale_gpu_memory_free_bytes"].add(dl, g.memory_free_bytes)
        f["gpuscale_gpu_memory_total_bytes"].add(dl, g.memory_total_bytes)
        f["gpuscale_gpu_memory_reserved_bytes"].add(dl, g.memory_reserved_bytes)
        f["gpuscale_gpu_power_limit_watts"].add(dl, g.power_limit_watts)
        f["gpuscale_gpu_energy_joules"].add(dl, g.energy_millijoules)
        f["gpuscale_gpu_nvlink_tx_bytes_per_second"].add(dl, g.nvlink_tx_bytes_per_second)
        f["gpuscale_gpu_nvlink_rx_bytes_per_second"].add(dl, g.nvlink_rx_bytes_per_second)
        f["gpuscale_gpu_pcie_tx_bytes_per_second"].add(dl, g.pcie_tx_bytes_per_second)
        f["gpuscale_gpu_pcie_rx_bytes_per_second"].add(dl, g.pcie_rx_bytes_per_second)

    @staticmethod
    def _dcgm_mig(f: dict[str, _Family], ml: dict[str, str], m: MigSample) -> None:
        used, total = m.memory_used_bytes, m.memory_total_bytes
        f["DCGM_FI_DEV_FB_USED"].add(ml, used)
        if not isinstance(used, Absent) and not isinstance(total, Absent):
            f["DCGM_FI_DEV_FB_FREE"].add(ml, total - used)
        f["DCGM_FI_PROF_GR_ENGINE_ACTIVE"].add(ml, m.utilization_percent)

    @staticmethod
    def _mig(f: dict[str, _Family], ml: dict[str, str], m: MigSample) -> None:
        used, total = m.memory_used_bytes, m.memory_total_bytes
        f["gpuscale_mig_utilization_percent"].add(ml, m.utilization_percent)
        f["gpuscale_mig_memory_used_bytes"].add(ml, used)
        f["gpuscale_mig_memory_total_bytes"].add(ml, total)

    @staticmethod
    def _processes(f: dict[str, _Family], dl: dict[str, str], g: GpuSample) -> None:
        def by_memory(p: ProcessSample) -> int:
            return p.used_memory_bytes if not isinstance(p.used_memory_bytes, Absent) else -1

        for p in sorted(g.processes, key=by_memory, reverse=True)[:MAX_PROCESS_SERIES_PER_GPU]:
            pl = {**dl, "pid": str(p.pid)}
            if p.gpu_instance_id is not None:
                pl["GPU_I_ID"] = str(p.gpu_instance_id)
            f["gpuscale_process_gpu_memory_used_bytes"].add(pl, p.used_memory_bytes)
            f["gpuscale_process_sm_utilization_percent"].add(pl, p.sm_util_percent)


Holder = tuple[str, str, str]  # namespace, pod, container


def _amd_physical(f: dict[str, _Family], al: dict[str, str], g: GpuSample) -> None:
    f["gpu_gfx_activity"].add(al, g.utilization_percent)
    f["gpu_umc_activity"].add(al, g.memory_util_percent)
    f["gpu_package_power"].add(al, g.power_watts)
    f["gpu_junction_temperature"].add(al, g.temperature_c)


def _amd_vram(f: dict[str, _Family], al: dict[str, str], used: IntReading,
              total: IntReading) -> None:
    f["gpu_used_vram"].add(al, used)
    f["gpu_total_vram"].add(al, total)
    f["gpu_free_vram"].add(al, total if isinstance(total, Absent) else
                           used if isinstance(used, Absent) else total - used)


def _holders(att: NodeAttribution | None) -> dict[str, list[Holder]]:
    """Device UUID (GPU, or MIG instance) -> the pod containers holding it."""
    out: dict[str, list[Holder]] = {}
    for p in att.pods if att is not None else ():
        for d in p.devices:
            holders = out.setdefault(d.mig_uuid or d.gpu_uuid, [])
            if (p.namespace, p.pod, p.container) not in holders:
                holders.append((p.namespace, p.pod, p.container))
    return out


def _with_pods(labels: dict[str, str], holders: list[Holder],
               mig_parent: bool) -> list[dict[str, str]]:
    if not holders or mig_parent:  # a MIG GPU's device-level series belong to no one pod
        return [labels]
    return [{**labels, "pod": pod, "namespace": ns, "container": c} for ns, pod, c in holders]


def _readings(g: GpuSample) -> Iterable[tuple[str, float | Absent]]:
    yield "utilization", g.utilization_percent
    yield "memory_utilization", g.memory_util_percent
    yield "memory", g.memory_used_bytes
    yield "power", g.power_watts
    yield "power_limit", g.power_limit_watts
    yield "temperature", g.temperature_c
    yield "sm_clock", g.sm_clock_mhz
    yield "energy", g.energy_millijoules
    yield "nvlink", g.nvlink_tx_bytes_per_second
    yield "pcie", g.pcie_tx_bytes_per_second


# name, help, scale (to the exported unit), counter
_FAMILIES: tuple[tuple[str, str, float, bool], ...] = (
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", 1.0, False),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", 1.0, False),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", 1 / MIB, False),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", 1 / MIB, False),
    ("DCGM_FI_DEV_FB_RESERVED", "Framebuffer memory reserved (in MiB).", 1 / MIB, False),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", 1.0, False),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", 1.0, False),
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", 1.0, False),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
     "Total energy consumption since boot (in mJ); monotonic.", 1.0, False),
    ("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", 1.0,
     False),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active.", 0.01, False),
    ("gpu_gfx_activity", "AMD: graphics/compute engine activity (in %).", 1.0, False),
    ("gpu_umc_activity", "AMD: memory controller activity (in %).", 1.0, False),
    ("gpu_used_vram", "AMD: VRAM used (in MiB).", 1 / MIB, False),
    ("gpu_total_vram", "AMD: VRAM total (in MiB).", 1 / MIB, False),
    ("gpu_free_vram", "AMD: VRAM free (in MiB).", 1 / MIB, False),
    ("gpu_package_power", "AMD: current socket power (in W).", 1.0, False),
    ("gpu_junction_temperature", "AMD: hotspot (junction) temperature (in C).", 1.0, False),
    ("gpuscale_gpu_up", "1 when the GPU answered; 0 when lost or unavailable.", 1.0, False),
    ("gpuscale_gpu_xid_errors", "XID error events seen by this agent.", 1.0, True),
    ("gpuscale_gpu_utilization_percent",
     "Kernel duty cycle averaged over the driver's samples in the window (0-100).", 1.0, False),
    ("gpuscale_gpu_utilization_samples", "Driver samples averaged into the utilization.", 1.0,
     False),
    ("gpuscale_gpu_memory_used_bytes", "Framebuffer used.", 1.0, False),
    ("gpuscale_gpu_memory_free_bytes", "Framebuffer free.", 1.0, False),
    ("gpuscale_gpu_memory_total_bytes", "Framebuffer total.", 1.0, False),
    ("gpuscale_gpu_memory_reserved_bytes", "Framebuffer reserved by the driver.", 1.0, False),
    ("gpuscale_gpu_power_limit_watts", "Enforced power limit.", 1.0, False),
    ("gpuscale_gpu_energy_joules", "Energy consumed since the driver loaded.", 0.001, True),
    ("gpuscale_gpu_nvlink_tx_bytes_per_second", "NVLink data sent, all links.", 1.0, False),
    ("gpuscale_gpu_nvlink_rx_bytes_per_second", "NVLink data received, all links.", 1.0, False),
    ("gpuscale_gpu_pcie_tx_bytes_per_second", "PCIe data sent (when enabled).", 1.0, False),
    ("gpuscale_gpu_pcie_rx_bytes_per_second", "PCIe data received (when enabled).", 1.0, False),
    ("gpuscale_mig_utilization_percent",
     "MIG instance graphics-engine activity from GPM (0-100).", 1.0, False),
    ("gpuscale_mig_memory_used_bytes", "MIG instance memory used.", 1.0, False),
    ("gpuscale_mig_memory_total_bytes", "MIG instance memory.", 1.0, False),
    ("gpuscale_process_gpu_memory_used_bytes", "GPU memory used by a process.", 1.0, False),
    ("gpuscale_process_sm_utilization_percent",
     "A process's SM duty cycle averaged over the window (0-100).", 1.0, False),
)
