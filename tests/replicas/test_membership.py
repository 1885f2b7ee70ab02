"""The replica set changing at run time: health checks and live-state polls
follow it, admission tracks it, and a draining or leaving replica is out of
routing and admission."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass

from gateway.admission.controller import AdmissionController
from gateway.config.schema import AdmissionConfig, HealthConfig, ReplicaConfig
from gateway.replicas.poller import LiveStatePoller
from gateway.replicas.registry import HealthMonitor, ReplicaRegistry
from tests.ctxkit import make_ctx


@dataclass
class Answer:
    status: int
    body: bytes = b""


class Probes:
    """A ProbeClient that answers every GET with 200 and counts them per URL."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def get(
        self, url: str, timeout: float, headers: Mapping[str, str] | None = None
    ) -> Answer:
        self.asked.append(url)
        return Answer(200, b'{"data": []}' if url.endswith("/v1/models") else b"")


def _config(name: str) -> ReplicaConfig:
    return ReplicaConfig(url=f"http://{name}:8000", name=name, kind="vllm")


def test_health_checks_follow_replicas_that_join_and_leave() -> None:
    async def scenario() -> None:
        registry = ReplicaRegistry((_config("a"),))
        probes = Probes()
        health = HealthMonitor(registry, probes, HealthConfig(interval_s=3600))
        admission = AdmissionController(AdmissionConfig(), registry)
        poller = LiveStatePoller(
            registry, probes, AdmissionConfig(), admission.trackers, admission.on_update
        )
        await health.check_all()
        await health.start()
        await poller.start()
        try:
            b = registry.add(_config("b"))
            assert b is not None and not b.healthy and b.live is not None
            assert set(admission.trackers) == {"a", "b"}
            for _ in range(200):  # its first check runs at once, not after interval_s
                if b.healthy:
                    break
                await asyncio.sleep(0.01)
            assert b.healthy and [r.name for r in registry.healthy()] == ["a", "b"]
            assert len(health._tasks) == 2 and len(poller._tasks) == 2
            registry.remove("b")
            assert b.leaving and [r.name for r in registry.healthy()] == ["a"]
            assert len(health._tasks) == 1 and len(poller._tasks) == 1
            assert set(admission.trackers) == {"a"}
            await poller.poll(b)  # a poll under way when it left: nothing to update
        finally:
            await poller.stop()
            await health.stop()
        assert len(health._tasks) == 0

    asyncio.run(scenario())


def test_a_draining_replica_is_out_of_routing_and_admission() -> None:
    async def scenario() -> None:
        registry = ReplicaRegistry((_config("a"), _config("b")))
        for r in registry:
            r.health.healthy = True
        admission = AdmissionController(AdmissionConfig(max_engine_waiting=None), registry)
        a = registry.get("a")
        assert a is not None
        ctx = make_ctx()
        assert admission.can_admit(ctx, a)
        assert registry.set_draining("a", True) is a
        assert [r.name for r in registry.healthy()] == ["b"]
        assert not admission.can_admit(ctx, a)  # a request queued before the drain skips it
        assert registry.set_draining("nope", True) is None
        registry.set_draining("a", False)
        assert admission.can_admit(ctx, a) and len(registry.healthy()) == 2

    asyncio.run(scenario())
