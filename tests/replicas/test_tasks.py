"""Per-replica background tasks: kept in step with the replica set, supervised
(a crashed round is logged and its task restarted), all awaited by `stop`."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import pytest

from gateway.replicas.tasks import ReplicaTasks


@dataclass(frozen=True)
class R:
    name: str


def test_a_crashed_task_is_logged_and_restarted_without_its_first_round_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runs: list[tuple[str, bool]] = []

    async def body(replica: R, first_now: bool) -> None:
        runs.append((replica.name, first_now))
        if len(runs) == 1:
            raise RuntimeError("a bug in a round")
        await asyncio.sleep(3600)

    async def scenario() -> None:
        tasks = ReplicaTasks[R]("poll", body)
        tasks.start(())
        tasks.add(R("a"))
        for _ in range(200):  # the restart waits 0.1 s
            if len(runs) == 2:
                break
            await asyncio.sleep(0.01)
        assert len(tasks) == 1
        await asyncio.wait_for(tasks.stop(), 5)

    with caplog.at_level(logging.ERROR, "gateway.supervise"):
        asyncio.run(scenario())
    assert runs == [("a", True), ("a", False)]
    crashes = [r for r in caplog.records if "crashed" in r.getMessage()]
    assert len(crashes) == 1 and "poll" in crashes[0].getMessage()


def test_a_removed_replica_s_task_is_cancelled_and_stop_awaits_every_task() -> None:
    ended: list[str] = []

    async def body(replica: R, first_now: bool) -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            ended.append(replica.name)

    async def scenario() -> None:
        tasks = ReplicaTasks[R]("health", body)
        tasks.start([R("a"), R("b")])
        tasks.add(R("a"))  # already there: one task per replica
        assert len(tasks) == 2
        await asyncio.sleep(0)
        tasks.remove("a")
        assert len(tasks) == 1
        await asyncio.wait_for(tasks.stop(), 5)
        assert len(tasks) == 0
        tasks.add(R("c"))  # stopped: nothing starts
        assert len(tasks) == 0

    asyncio.run(scenario())
    assert sorted(ended) == ["a", "b"]
