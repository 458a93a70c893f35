"""A host sysfs's DRM render nodes, laid out as the kernel does, in a test's directory."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def drm_tree(root: Path, devices: Mapping[int, str]) -> Path:
    """Render node minor -> the device owning it (a PCI function ``0000:05:00.0`` or an
    amdgpu partition's platform device ``amdgpu_xcp_3``). As on a host:
    ``class/drm/renderD<n>`` links to the node under its device's directory, and the
    node's ``device`` links back up to that directory as the kernel writes it
    (``../../../<device>``). Returns ``root``."""
    links = root / "class" / "drm"
    links.mkdir(parents=True, exist_ok=True)
    for minor, name in devices.items():
        bus = "platform" if name.startswith("amdgpu_xcp_") else "pci0000:00"
        node = root / "devices" / bus / name / "drm" / f"renderD{minor}"
        node.mkdir(parents=True, exist_ok=True)
        (node / "device").symlink_to(Path("..") / ".." / ".." / name)
        (links / f"renderD{minor}").symlink_to(os.path.relpath(node, links))
    return root
