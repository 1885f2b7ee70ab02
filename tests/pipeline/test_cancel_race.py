"""The disconnect watcher is driven by `receive()`, not by polling.

A raw ASGI harness: `receive` is a function we control and count, so the
test sees exactly how often the gateway asks for the client's next message.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from starlette.datastructures import Headers

from gateway.pipeline.endpoint import _race_disconnect, _receive_watch
from gateway.request.context import RequestContext


class Client:
    """An ASGI `receive` that blocks until the test disconnects the client."""

    def __init__(self) -> None:
        self.calls = 0
        self.gone = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        self.calls += 1
        await self.gone.wait()
        return {"type": "http.disconnect"}


def _ctx() -> RequestContext:
    return RequestContext(
        request_id="r", endpoint="chat", path="/", headers=Headers({}), received_at=time.monotonic()
    )


def test_watcher_asks_once_and_does_not_poll() -> None:
    async def scenario() -> tuple[int, bool]:
        client = Client()
        done = False

        async def work() -> None:
            nonlocal done
            await asyncio.sleep(0.3)
            done = True

        await _race_disconnect(work(), _receive_watch(client.receive), _ctx())
        return client.calls, done

    calls, done = asyncio.run(scenario())
    assert done
    assert calls == 1, f"receive() called {calls} times during 0.3 s of work: that is polling"


def test_disconnect_cancels_the_work_at_once() -> None:
    async def scenario() -> tuple[float, bool]:
        client = Client()
        cancelled = asyncio.Event()
        loop = asyncio.get_running_loop()

        async def work() -> None:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        loop.call_later(0.05, client.gone.set)
        t0 = loop.time()
        await _race_disconnect(work(), _receive_watch(client.receive), _ctx())
        return loop.time() - t0, cancelled.is_set()

    elapsed, cancelled = asyncio.run(scenario())
    assert cancelled
    assert elapsed < 1.0, elapsed


def test_disconnect_after_last_byte_lets_settling_finish() -> None:
    async def scenario() -> bool:
        client = Client()
        ctx = _ctx()
        settled = False

        async def work() -> None:
            nonlocal settled
            ctx.response.complete = True
            client.gone.set()
            await asyncio.sleep(0.1)  # settling (lease release, budget settle) after the last byte
            settled = True

        await _race_disconnect(work(), _receive_watch(client.receive), ctx)
        return settled

    assert asyncio.run(scenario())


def test_an_outside_cancellation_propagates_and_cancels_the_work() -> None:
    """Server shutdown cancels the request task: that must not be absorbed as a client "
    "disconnect."""

    async def scenario() -> tuple[bool, bool]:
        client = Client()
        work_cancelled = False

        async def work() -> None:
            nonlocal work_cancelled
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                work_cancelled = True
                raise

        task = asyncio.ensure_future(
            _race_disconnect(work(), _receive_watch(client.receive), _ctx())
        )
        await asyncio.sleep(0.05)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return True, work_cancelled
        return False, work_cancelled

    propagated, work_cancelled = asyncio.run(scenario())
    assert propagated and work_cancelled


def test_a_disconnect_is_absorbed_and_leaves_the_task_usable() -> None:
    """After the client left, the request task carries no pending cancellation."""

    async def scenario() -> bool:
        client = Client()

        async def work() -> None:
            client.gone.set()
            await asyncio.sleep(30)

        await _race_disconnect(work(), _receive_watch(client.receive), _ctx())
        await asyncio.sleep(0.01)  # would raise CancelledError if a cancellation were left pending
        task = asyncio.current_task()
        return task is not None and task.cancelling() == 0

    assert asyncio.run(scenario())
