"""Simulated backend: one node of a scenario, read as NVML would report it.

Readings are pure functions of scenario time except the energy counter, which integrates
power between samples like the real one. Behaviour mirrors the hardware where it matters to
the layers above: MIG instances have no device utilization (GPM only on parts that have it),
per-process SM % is reported on non-MIG GPUs, and time-sliced processes that ask for more
than 100 % together get a proportional share of the duty cycle.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gpuscale.telemetry.catalog import MIB
from gpuscale.telemetry.model import (
    Absent,
    GpuSample,
    MigSample,
    NodeSnapshot,
    ProcessSample,
    Reading,
    SharingMode,
)
from gpuscale.telemetry.scenario import GpuSpec, NodeSpec, ProcessSpec, gpu_uuid, mig_uuid

_NVLINK_BYTES_PER_UTIL_PERCENT = 2.0e9  # an SXM part moving ~200 GB/s at full duty


class SimulatedBackend:
    """GPU readings for ``node`` at scenario time ``(clock() - start) * speed``.

    ``follow``, when given, is called at the start of each sample and returns a node to
    swap in (same GPUs, new processes: a scenario file that changed) or None. A process
    swapped in runs on the same scenario clock as the rest: its load curve is read at the
    scenario time of the sample, not at the time since it appeared.
    """

    name = "sim"

    def __init__(self, node: NodeSpec, clock: Callable[[], float] = time.time,
                 start: float | None = None, speed: float = 1.0, pcie: bool = False,
                 monotonic: Callable[[], float] = time.monotonic,
                 follow: Callable[[], NodeSpec | None] | None = None) -> None:
        self.node = node
        self._node = node
        self._follow = follow
        self._clock = clock
        self._monotonic = monotonic
        self._start = clock() if start is None else start
        self._speed = speed
        self._pcie = pcie
        self._energy_mj = [0.0] * len(node.gpus)
        self._last_power: list[tuple[float, float] | None] = [None] * len(node.gpus)

    def replace_node(self, node: NodeSpec) -> None:
        """Swap the node's processes (the live demo's replicas come and go); the GPUs must
        stay the same, since energy counters continue."""
        if node.gpus != self._node.gpus:
            raise ValueError("replace_node keeps the node's GPUs; only processes change")
        self.node = self._node = node

    def scenario_time(self) -> float:
        return (self._clock() - self._start) * self._speed

    def sample(self) -> NodeSnapshot:
        began = self._monotonic()
        if self._follow is not None and (changed := self._follow()) is not None:
            self.replace_node(changed)
        now = self._clock()
        t = (now - self._start) * self._speed
        gpus = tuple(self._gpu(spec, t, now) for spec in self._node.gpus)
        return NodeSnapshot(node=self._node.name, backend=self.name, taken_at=now,
                            monotonic=began, driver_version="sim", gpus=gpus,
                            duration_seconds=self._monotonic() - began)

    def close(self) -> None:
        pass

    def _gpu(self, spec: GpuSpec, t: float, now: float) -> GpuSample:
        model = spec.model
        procs = [p for p in self._node.processes if p.gpu == spec.index]
        migs: tuple[MigSample, ...] = ()
        util: Reading
        if spec.sharing is SharingMode.MIG:
            migs = tuple(self._mig(spec, i, [p for p in procs if p.mig == i], t)
                         for i in range(len(spec.mig)))
            util = Absent.UNSUPPORTED  # NVML has no device utilization in MIG mode
            # Power follows the busy share of the slices.
            busy = sum(min(100.0, sum(p.load.at(t) for p in procs if p.mig == i))
                       * prof.slices for i, prof in enumerate(spec.mig)) / 7.0
            processes = tuple(p for m in migs for p in m.processes)
        else:
            shares = _shares(procs, t)
            busy = min(100.0, float(sum(shares)))
            util = busy
            processes = tuple(ProcessSample(p.pid, int(p.memory_mib * MIB), s, s * 0.6)
                              for p, s in zip(procs, shares, strict=True))
        total = model.memory_mib * MIB
        reserved = int(total * 0.006)
        used = min(total - reserved, int(sum(p.memory_mib for p in procs) * MIB))
        power = model.idle_power_watts + (model.power_limit_watts - model.idle_power_watts) * (
            busy / 100.0)
        self._integrate_energy(spec.index, now, power)
        nvlink: Reading = Absent.UNSUPPORTED
        if model.key.startswith(("H100", "H200", "A100")):
            nvlink = busy * _NVLINK_BYTES_PER_UTIL_PERCENT / 100.0
        pcie: Reading = busy * 1.0e8 if self._pcie else Absent.UNSUPPORTED
        clock = model.idle_sm_clock_mhz if busy < 1 else model.max_sm_clock_mhz
        return GpuSample(
            index=spec.index, uuid=gpu_uuid(self._node.name, spec.index), name=model.name,
            pci_bus_id=f"00000000:{0x18 + spec.index * 0x10:02X}:00.0",
            minor_number=spec.index, utilization_percent=util,
            utilization_samples=6 if not isinstance(util, Absent) else 0,
            memory_util_percent=busy * 0.6 if not migs else Absent.UNSUPPORTED,
            memory_used_bytes=used, memory_free_bytes=total - reserved - used,
            memory_total_bytes=total, memory_reserved_bytes=reserved,
            power_watts=power, power_limit_watts=model.power_limit_watts,
            temperature_c=30.0 + 45.0 * busy / 100.0, sm_clock_mhz=float(clock),
            energy_millijoules=int(self._energy_mj[spec.index]),
            nvlink_tx_bytes_per_second=nvlink, nvlink_rx_bytes_per_second=nvlink,
            pcie_tx_bytes_per_second=pcie, pcie_rx_bytes_per_second=pcie,
            mig_enabled=spec.sharing is SharingMode.MIG, sharing=spec.sharing,
            migs=migs, processes=processes)

    def _mig(self, spec: GpuSpec, i: int, procs: list[ProcessSpec], t: float) -> MigSample:
        prof = spec.mig[i]
        util: Reading = (min(100.0, sum(p.load.at(t) for p in procs)) if spec.model.gpm
                         else Absent.UNSUPPORTED)
        gi = i + 1  # GPU-instance ids start at 1 on real parts
        return MigSample(
            uuid=mig_uuid(self._node.name, spec.index, i),
            parent_uuid=gpu_uuid(self._node.name, spec.index), index=i,
            gpu_instance_id=gi, compute_instance_id=0, profile=prof.name,
            memory_used_bytes=int(sum(p.memory_mib for p in procs) * MIB),
            memory_total_bytes=prof.memory_mib * MIB, utilization_percent=util,
            processes=tuple(ProcessSample(p.pid, int(p.memory_mib * MIB), Absent.UNSUPPORTED,
                                          Absent.UNSUPPORTED, gi, 0) for p in procs))

    def _integrate_energy(self, index: int, now: float, power: float) -> None:
        last = self._last_power[index]
        if last is not None and now > last[0]:
            self._energy_mj[index] += (now - last[0]) * (power + last[1]) / 2.0 * 1000.0
        self._last_power[index] = (now, power)


def _shares(procs: list[ProcessSpec], t: float) -> list[float]:
    """Each process's duty cycle; scaled down together when they ask for more than 100 %."""
    wants = [p.load.at(t) for p in procs]
    total = sum(wants)
    if total <= 100.0:
        return wants
    return [w * 100.0 / total for w in wants]
