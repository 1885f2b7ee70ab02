"""One timer per request: phase bounds, deadline, and no timer churn per chunk."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.request.timer import RequestTimer, phase


def test_a_phase_bound_fires_as_timeout_and_the_deadline_still_holds() -> None:
    async def scenario() -> tuple[float, float, bool]:
        loop = asyncio.get_running_loop()
        timer = RequestTimer(loop.time() + 0.5)
        t0 = loop.time()
        with pytest.raises(TimeoutError):
            await phase(timer, asyncio.sleep(5), 0.05, "first token")
        phase_s = loop.time() - t0
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0  # the phase's cancellation was claimed
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            claimed = timer.claim("deadline")
        return phase_s, loop.time() - t0, claimed

    phase_s, deadline_s, claimed = asyncio.run(scenario())
    assert 0.03 < phase_s < 0.4, phase_s
    assert 0.3 < deadline_s < 2.0, deadline_s
    assert claimed


def test_many_phases_moving_later_arm_few_timers() -> None:
    async def scenario() -> int:
        loop = asyncio.get_running_loop()
        armed = 0
        real_call_at = loop.call_at

        def counting_call_at(when: float, callback: Any, *args: Any) -> asyncio.TimerHandle:
            nonlocal armed
            armed += 1
            return real_call_at(when, callback, *args)

        loop.call_at = counting_call_at  # type: ignore[method-assign]
        timer = RequestTimer(loop.time() + 60)
        for _ in range(200):  # a 200-chunk stream with a 30 s idle bound
            await phase(timer, asyncio.sleep(0), 30.0, "data (idle gap)")
        timer.close()
        return armed

    assert asyncio.run(scenario()) <= 3


def test_an_outside_cancellation_during_a_phase_is_not_a_timeout() -> None:
    async def scenario() -> str:
        loop = asyncio.get_running_loop()

        async def request() -> str:
            timer = RequestTimer(loop.time() + 30)
            try:
                await phase(timer, asyncio.sleep(5), 10.0, "first token")
            except TimeoutError:
                return "timeout"
            except asyncio.CancelledError:
                return "cancelled"
            finally:
                timer.close()
            return "done"

        task = asyncio.ensure_future(request())
        await asyncio.sleep(0.05)
        task.cancel()  # the client went away
        return await task

    assert asyncio.run(scenario()) == "cancelled"


def test_moving_the_deadline_earlier_rearms_at_once() -> None:
    async def scenario() -> float:
        loop = asyncio.get_running_loop()
        timer = RequestTimer(loop.time() + 30)
        t0 = loop.time()
        timer.set_deadline(loop.time() + 0.05)
        with pytest.raises(asyncio.CancelledError):
            await asyncio.sleep(5)
        assert timer.claim("deadline")
        return loop.time() - t0

    assert asyncio.run(scenario()) < 1.0


def test_a_horizon_arms_one_timer_for_the_whole_request() -> None:
    async def scenario() -> int:
        loop = asyncio.get_running_loop()
        armed = 0
        real_call_at = loop.call_at

        def counting_call_at(when: float, callback: Any, *args: Any) -> asyncio.TimerHandle:
            nonlocal armed
            armed += 1
            return real_call_at(when, callback, *args)

        loop.call_at = counting_call_at  # type: ignore[method-assign]
        timer = RequestTimer(loop.time() + 600, horizon_s=30.0)
        await phase(timer, asyncio.sleep(0), 600.0, "response headers")
        for _ in range(200):
            await phase(timer, asyncio.sleep(0), 30.0, "data (idle gap)")
        timer.close()
        return armed

    assert asyncio.run(scenario()) == 1


def test_a_phase_longer_than_the_horizon_still_fires_on_time() -> None:
    async def scenario() -> float:
        loop = asyncio.get_running_loop()
        timer = RequestTimer(loop.time() + 30, horizon_s=0.05)
        t0 = loop.time()
        with pytest.raises(TimeoutError):
            await phase(timer, asyncio.sleep(5), 0.3, "first token")
        timer.close()
        return loop.time() - t0

    elapsed = asyncio.run(scenario())
    assert 0.25 < elapsed < 2.0, elapsed
