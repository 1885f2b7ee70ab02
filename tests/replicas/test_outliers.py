"""Passive health: replicas whose exchanges keep failing leave routing for a
while, with a backoff that grows while they keep failing."""

from __future__ import annotations

import time

import httpx
import pytest

from gateway.config.scheduling import SchedulingConfig
from gateway.config.schema import HealthConfig, ReplicaConfig
from gateway.errors import (
    BadRequest,
    DeadlineExceeded,
    UpstreamError,
    UpstreamNeverReached,
    UpstreamStaleConnection,
    UpstreamUnavailable,
)
from gateway.replicas.outliers import OutlierDetector, failed_exchange
from gateway.replicas.registry import Replica, ReplicaRegistry
from gateway.sim import SimCluster
from tests.gwharness import running_gateway


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_what_counts_against_a_replica() -> None:
    assert failed_exchange(None) is False
    assert failed_exchange(UpstreamNeverReached("refused")) is True
    assert failed_exchange(UpstreamUnavailable("broke mid-stream")) is True
    assert failed_exchange(UpstreamError("boom", status=500)) is True
    assert failed_exchange(UpstreamError("too long", status=400)) is False
    assert failed_exchange(UpstreamStaleConnection("stale")) is None
    assert failed_exchange(DeadlineExceeded("client's deadline")) is None
    assert failed_exchange(BadRequest("bad")) is None


def test_ejection_after_n_failures_with_a_growing_backoff() -> None:
    clock = Clock()
    ejected: list[str] = []
    cfg = HealthConfig(eject_after=3, eject_base_s=10.0, eject_max_s=25.0)
    det = OutlierDetector(cfg, lambda r: ejected.append(r.name), clock)
    r = Replica(ReplicaConfig(url="http://127.0.0.1:1", name="r"))
    for _ in range(2):
        det.record(r, True)
    assert r.ejection.until <= clock.now
    det.record(r, None)  # says nothing
    det.record(r, True)
    assert r.ejection.until == clock.now + 10.0 and ejected == ["r"]
    clock.now += 11
    det.record(r, True)  # back, and failing again: ejected at once, for longer
    assert r.ejection.until == clock.now + 20.0
    clock.now += 21
    det.record(r, True)
    assert r.ejection.until == clock.now + 25.0  # capped
    clock.now += 26
    det.record(r, False)  # it works again: forgiven
    assert (r.ejection.exchange_failures, r.ejection.ejections) == (0, 0)
    det.record(r, True)
    assert r.ejection.until < clock.now


def test_an_ejected_replica_is_out_of_routing_until_its_time_is_up() -> None:
    reg = ReplicaRegistry(
        (
            ReplicaConfig(url="http://127.0.0.1:1", name="a"),
            ReplicaConfig(url="http://127.0.0.1:2", name="b"),
        )
    )
    for r in reg:
        r.health.healthy = True
    a = reg.replicas[0]
    a.ejection.until = time.monotonic() + 30
    assert [r.name for r in reg.healthy()] == ["b"]
    a.ejection.until = time.monotonic() - 1
    assert [r.name for r in reg.healthy()] == ["a", "b"]


@pytest.mark.parametrize("fault", [{"error_status": 500}, {"die_after_tokens": 2}])
def test_traffic_moves_away_from_a_failing_replica_and_comes_back(fault: dict[str, int]) -> None:
    health = HealthConfig(
        interval_s=0.2, timeout_s=1.0, unhealthy_after=1, healthy_after=1,
        eject_after=2, eject_base_s=3.0, eject_max_s=6.0,
    )  # fmt: skip
    # The first ejection (3 s) outlasts the twelve requests below even on a
    # loaded machine (each ~40 ms of simulated generation): a second failure
    # after it expired would make the count depend on timing.
    with (
        SimCluster.start(2, speed=200) as sims,
        running_gateway(
            sims.urls, health=health, scheduling=SchedulingConfig(policy="round-robin")
        ) as gw,
    ):
        time.sleep(0.5)
        httpx.post(sims.urls[0] + "/sim/fault", json=fault, timeout=10).raise_for_status()
        url = gw.url + "/v1/chat/completions"
        body = {
            "model": "sim-model",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 8,
            "stream": True,
            "ignore_eos": True,
        }

        def ask() -> tuple[str, bool]:
            with httpx.stream("POST", url, json=body, timeout=30) as r:
                text = b"".join(r.iter_bytes()).decode()
            ok = r.status_code == 200 and "data: [DONE]" in text and '"error"' not in text
            return r.headers.get("x-gateway-replica", ""), ok

        bad = sims.urls[0].split("//", 1)[1]  # a replica given by URL is named host:port
        first = [ask() for _ in range(12)]
        good = sims.urls[1].split("//", 1)[1]
        assert 1 <= sum(not ok for _, ok in first) <= 2, first  # error answers name no replica
        assert all(ok and replica == good for replica, ok in first[6:]), first
        assert f'gateway_replica_ejections_total{{replica="{bad}"}}' in gw.metrics_text()
        httpx.post(sims.urls[0] + "/sim/fault", json={"clear": True}, timeout=10)
        time.sleep(3.2)
        later = [ask() for _ in range(6)]
        assert all(ok for _, ok in later)
        assert bad in {replica for replica, _ in later}  # back in routing
