"""Fixtures of the end-to-end tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.attribution_node import sharing_cluster
from tests.peers.kubeapi import KubeApiPeer
from tests.peers.kubelet import KubeletPeer


@pytest.fixture
def cluster(kubelet: KubeletPeer, kubeapi: KubeApiPeer,
            tmp_path: Path) -> tuple[KubeletPeer, KubeApiPeer, Path]:
    """The attribution node's kubelet and API server with its pods, and its /proc tree."""
    return sharing_cluster(kubelet, kubeapi, tmp_path)
