"""Device IDs and resource names of the NVIDIA device plugin."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuscale.attribution.devices import DeviceIdError, is_gpu_resource, parse_device_id
from gpuscale.attribution.model import DeviceKind

U = "8e3c2e5a-76b4-4f1c-a1c3-0d4b6f2e9a71"


@pytest.mark.parametrize(("raw", "kind", "uuid", "gi", "ci", "replica"), [
    (f"GPU-{U}", DeviceKind.GPU, f"GPU-{U}", None, None, None),
    (f"GPU-{U}::3", DeviceKind.GPU, f"GPU-{U}", None, None, 3),
    (f"MIG-{U}", DeviceKind.MIG, f"MIG-{U}", None, None, None),
    (f"MIG-{U}::0", DeviceKind.MIG, f"MIG-{U}", None, None, 0),
    (f"MIG-GPU-{U}/7/0", DeviceKind.MIG, f"GPU-{U}", 7, 0, None),
    (f"MIG-GPU-{U}/13/1::12", DeviceKind.MIG, f"GPU-{U}", 13, 1, 12),
])
def test_every_form(raw: str, kind: DeviceKind, uuid: str, gi: int | None, ci: int | None,
                    replica: int | None) -> None:
    ref = parse_device_id(raw)
    assert (ref.kind, ref.uuid, ref.gpu_instance_id, ref.compute_instance_id, ref.replica) == (
        kind, uuid, gi, ci, replica)


@pytest.mark.parametrize("raw", [
    "", "0", "GPU-", f"GPU-{U}::", f"GPU-{U}::x", f"gpu-{U}", f"GPU-{U} ", f"MIG-GPU-{U}/7",
    f"MIG-GPU-{U}/a/0", f"GPU-{U}\n", "GPU-" + "0" * 300, f"MIG-MIG-{U}", f"GPU-{U}::1::2"])
def test_malformed(raw: str) -> None:
    with pytest.raises(DeviceIdError):
        parse_device_id(raw)


@given(st.text(max_size=300))
def test_arbitrary_text_parses_or_raises_device_id_error(raw: str) -> None:
    try:
        ref = parse_device_id(raw)
    except DeviceIdError:
        return
    assert ref.raw == raw
    assert ref.uuid.startswith(("GPU-", "MIG-")) or ref.kind is DeviceKind.PCI


@pytest.mark.parametrize(("name", "ours"), [
    ("nvidia.com/gpu", True), ("nvidia.com/gpu.shared", True),
    ("nvidia.com/mig-1g.10gb", True), ("nvidia.com/mig-3g.40gb.shared", True),
    ("nvidia.com/mig-1c.3g.40gb", True), ("nvidia.com/mig-x", False), ("cpu", False),
    ("amd.com/gpu", True), ("amd.com/cpx_nps4", True), ("amd.com/fpga", False),
    ("nvidia.com/gpu-typo", False)])
def test_resource_names(name: str, ours: bool) -> None:
    assert is_gpu_resource(name) is ours
