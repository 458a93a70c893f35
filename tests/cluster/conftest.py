"""The real control plane as a test peer: one cluster for the whole ``cluster`` stage,
built from the wrapper modules (``cluster/build``: cached, minutes when cold) and started
in a network namespace of its own (slot 1, so a ``./dev cluster`` beside it is untouched).
Tests read replica counts from the real API with the real kubectl."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cluster.session import Cluster, running

SLOT = 1


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running(tmp_path_factory.mktemp("cluster"), SLOT) as c:
        yield c
