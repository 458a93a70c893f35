"""The real control plane as a test peer: one cluster for the whole ``cluster`` stage,
built from the wrapper modules (``cluster/build``: cached, minutes when cold) and started
in a network namespace of its own (slot 1, so a ``./dev cluster`` beside it is untouched).
Tests read replica counts from the real API with the real kubectl."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from cluster.session import Cluster, running

SLOT = int(os.environ.get("GPUSCALE_CLUSTER_TEST_SLOT", "1"))  # 0 is ./dev cluster's


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running(tmp_path_factory.mktemp("cluster"), SLOT) as c:
        yield c
