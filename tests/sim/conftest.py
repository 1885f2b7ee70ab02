from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import httpx
import pytest

from gateway.sim import SimCluster
from tests.sim.helpers import TIMEOUT


class ClusterFactory(Protocol):
    def __call__(self, n: int = 1, **overrides: Any) -> SimCluster: ...


@pytest.fixture
def make_cluster() -> Iterator[ClusterFactory]:
    """Start simulated clusters that are stopped when the test ends."""
    started: list[SimCluster] = []

    def make(n: int = 1, **overrides: Any) -> SimCluster:
        overrides.setdefault("speed", 100.0)
        cluster = SimCluster.start(n, **overrides)
        started.append(cluster)
        return cluster

    yield make
    for cluster in started:
        cluster.stop()


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=TIMEOUT) as c:
        yield c
