"""DRA devices named from ResourceSlices (attribution/dra.py): the slices' contract, pure."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given

from gpuscale.attribution.dra import (
    MAX_DEVICES,
    DraInventory,
    dra_ref,
    parse_slice,
    resolve,
)
from gpuscale.attribution.model import Allocation, DeviceKind
from tests.peers.dra import AMD, NVIDIA, make_slice, nvidia_gpu, nvidia_mig
from tests.support.strategies import json_values

G0 = "GPU-00000000-0000-0000-0000-000000000000"
M0 = "MIG-00000000-0000-0000-0000-0000000000aa"


def slice_(*devices: tuple[str, dict[str, Any]], driver: str = NVIDIA, pool: str = "node-1",
           name: str = "s1", generation: int = 1, count: int = 1) -> dict[str, Any]:
    return make_slice(name, "node-1", driver, pool, list(devices), generation, count)


@pytest.mark.parametrize(("device", "driver", "kind", "uuid", "profile"), [
    (nvidia_gpu(0, G0), NVIDIA, DeviceKind.GPU, G0, ""),
    (nvidia_mig(1, G0, "1g.10gb", 19, 4, 1, uuid=M0), NVIDIA, DeviceKind.MIG, M0, ""),
    (nvidia_mig(1, G0, "1g.10gb", 19, 4, 1), NVIDIA, DeviceKind.MIG, G0, "1g.10gb"),
    (("gpu-0-128", {"type": "amdgpu", "resource.kubernetes.io/pciBusID": "0000:19:00.0"}),
     AMD, DeviceKind.PCI, "0000:19:00.0", ""),
    (("card", {"uuid": G0}), "gpu.example.com", DeviceKind.GPU, G0, ""),  # any driver
])
def test_a_slice_names_gpus_and_mig_devices(device: tuple[str, dict[str, Any]], driver: str,
                                            kind: DeviceKind, uuid: str,
                                            profile: str) -> None:
    got = parse_slice(slice_(device, driver=driver))
    assert not got.error
    (d,) = got.devices
    assert d.ref is not None
    assert (d.ref.kind, d.ref.uuid, d.ref.mig_profile) == (kind, uuid,
                                                                                 profile)


@pytest.mark.parametrize(("device", "driver", "why"), [
    (("gpu-0-129", {"type": "amdgpu-partition",
                    "resource.kubernetes.io/pciBusID": "0000:19:00.0"}), AMD, "partition"),
    (("gpu-vfio-0", {"type": "vfio", "uuid": "GPU-not-a-uuid"}), NVIDIA, "vfio"),
    (("eth-0", {"type": "nic"}), "nic.example.com", "names no GPU"),
    (("gpu-0", {"type": "gpu", "uuid": "GPU-12"}), NVIDIA, "names no GPU"),
])
def test_devices_whose_slice_names_no_readable_gpu(device: tuple[str, dict[str, Any]],
                                                   driver: str, why: str) -> None:
    (d,) = parse_slice(slice_(device, driver=driver)).devices
    assert d.ref is None
    assert why in d.why


def _spec(**spec: Any) -> dict[str, Any]:
    base = slice_(nvidia_gpu(0, G0))
    base["spec"].update(spec)
    return base


@pytest.mark.parametrize(("raw", "why"), [
    ({"metadata": {"name": "x"}}, "no spec"),
    (_spec(driver=""), "spec.driver"),
    (_spec(driver="GPU.NVIDIA.COM"), "DNS subdomain"),
    (_spec(driver="d" * 64), "longer than 63"),
    (_spec(pool="node-1"), "spec.pool is not an object"),
    (_spec(pool={"name": "p", "generation": -1, "resourceSliceCount": 1}), "generation"),
    (_spec(pool={"name": "p", "generation": True, "resourceSliceCount": 1}), "generation"),
    (_spec(pool={"name": "p", "generation": 1, "resourceSliceCount": 0}), "below 1"),
    (_spec(pool={"name": "p" * 254, "generation": 1, "resourceSliceCount": 1}), "253"),
    (_spec(devices={"gpu-0": {}}), "not a list"),
    (_spec(devices=[{"name": f"d{i}"} for i in range(MAX_DEVICES + 1)]), "129 devices"),
    (_spec(devices=["gpu-0"]), "not an object"),
    (_spec(devices=[{"name": "Bad_Name"}]), "DNS label"),
    (_spec(devices=[{"name": "d", "attributes": []}]), "attributes is not an object"),
    (_spec(devices=[{"name": "d", "attributes": {f"a{i}": {"int": i} for i in range(33)}}]),
     "33 attributes"),
    (_spec(devices=[{"name": "d", "attributes": {"uuid": {"string": G0, "int": 1}}}]),
     "not one value"),
    (_spec(devices=[{"name": "d", "attributes": {"uuid": {"string": "x" * 65}}}]),
     "at most 64"),
])
def test_malformed_and_oversized_slices_make_their_pool_unreadable(raw: dict[str, Any],
                                                                   why: str) -> None:
    got = parse_slice(raw)
    assert why in got.error
    assert got.devices == ()
    inv = DraInventory.build([got, parse_slice(slice_(nvidia_gpu(1, G0), name="s2"))])
    found = inv.lookup(NVIDIA, "node-1", "gpu-1")
    if got.driver and got.pool == "node-1":  # its pool is known: none of it is trusted
        assert isinstance(found, str)
        assert "unreadable" in found
    else:
        assert not isinstance(found, str)


@given(json_values(["spec", "driver", "pool", "name", "generation",
                     "resourceSliceCount", "devices", "attributes", "string", "uuid"]))
def test_any_json_is_read_or_refused_never_raised(raw: object) -> None:
    for candidate in (raw, {"spec": raw}, {"spec": {"driver": NVIDIA, "pool": {
            "name": "p", "generation": 1, "resourceSliceCount": 1}, "devices": raw}}):
        if isinstance(candidate, dict):
            parse_slice(candidate)


def test_only_the_highest_generation_counts_and_an_incomplete_pool_is_unreadable() -> None:
    old = parse_slice(slice_(nvidia_gpu(0, G0), generation=1, name="old"))
    new = parse_slice(slice_(("gpu-1", {"type": "gpu", "uuid": G0}), generation=2,
                             name="new"))
    inv = DraInventory.build([old, new])
    assert isinstance(inv.lookup(NVIDIA, "node-1", "gpu-0"), str)  # gone in generation 2
    assert not isinstance(inv.lookup(NVIDIA, "node-1", "gpu-1"), str)
    half = parse_slice(slice_(nvidia_gpu(0, G0), count=2))
    found = DraInventory.build([half]).lookup(NVIDIA, "node-1", "gpu-0")
    assert isinstance(found, str)
    assert "1 of its 2 ResourceSlices seen" in found


def test_resolve_names_the_claim_of_every_device_it_cannot_name() -> None:
    inv = DraInventory.build([parse_slice(slice_(nvidia_gpu(0, G0)))])
    alloc = Allocation("llm", "p", "c", "dra:gpus", (
        dra_ref("llm", "gpus", NVIDIA, "node-1", "gpu-0"),
        dra_ref("llm", "gpus", NVIDIA, "node-1", "gpu-7")))
    (got,), notes = resolve([alloc], inv)
    assert [d.kind for d in got.devices] == [DeviceKind.GPU, DeviceKind.UNKNOWN]
    assert got.devices[0].uuid == G0
    assert got.devices[0].claim == "llm/gpus"
    assert got.devices[1].raw.startswith("claim llm/gpus: gpu.nvidia.com/node-1/gpu-7 (")
    assert notes == ["llm/p/c: claim llm/gpus: gpu.nvidia.com/node-1/gpu-7: no "
                     "ResourceSlice of this node lists it (yet)"]
    (none,), notes = resolve([alloc], None, "no ResourceSlices: not listed yet")
    assert {d.kind for d in none.devices} == {DeviceKind.UNKNOWN}
    assert "not listed yet" in notes[0]
