"""Background tasks under a supervisor: a crash is logged and the task restarted."""

from __future__ import annotations

import asyncio
import logging

import pytest

from gateway.supervise import Supervisor


def test_a_crashed_task_is_logged_and_restarted(caplog: pytest.LogCaptureFixture) -> None:
    runs: list[int] = []

    async def flaky() -> None:
        runs.append(1)
        if len(runs) < 3:
            raise RuntimeError("boom")

    async def scenario() -> None:
        sup = Supervisor("test")
        await asyncio.wait_for(sup.spawn("flaky", flaky), 5)

    with caplog.at_level(logging.ERROR, "gateway.supervise"):
        asyncio.run(scenario())
    assert len(runs) == 3
    crashes = [r for r in caplog.records if "crashed" in r.getMessage()]
    assert len(crashes) == 2 and all(r.exc_info for r in crashes)


def test_a_task_that_keeps_crashing_stays_down() -> None:
    runs: list[int] = []

    async def broken() -> None:
        runs.append(1)
        raise RuntimeError("always")

    async def scenario() -> None:
        sup = Supervisor("test", max_restarts=2)
        await asyncio.wait_for(sup.spawn("broken", broken), 5)

    asyncio.run(scenario())
    assert len(runs) == 3  # the first run and two restarts


def test_stop_cancels_what_runs() -> None:
    async def scenario() -> asyncio.Task[None]:
        sup = Supervisor("test")
        task = sup.spawn("forever", lambda: asyncio.sleep(60))
        await asyncio.sleep(0)
        await asyncio.wait_for(sup.stop(), 5)
        return task

    assert asyncio.run(scenario()).cancelled()
