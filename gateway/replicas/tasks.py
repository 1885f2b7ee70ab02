"""One background task per replica (health checks, live-state polls), kept in
step with a replica set that changes at run time (`gateway.replicas.discovery`).

The tasks run under a `gateway.supervise.Supervisor`: a round that raises is
logged with its traceback and the task restarted after a backoff.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, Generic, Protocol, TypeVar

from gateway.supervise import Supervisor


class Named(Protocol):
    @property
    def name(self) -> str: ...


R = TypeVar("R", bound=Named)


class ReplicaTasks(Generic[R]):
    """`body(replica, first_now)`: the task's coroutine; `first_now` asks it to
    run its first round at once (a replica that joined at run time)."""

    def __init__(self, label: str, body: Callable[[R, bool], Coroutine[Any, Any, None]]) -> None:
        self._body = body
        self._supervisor = Supervisor(label)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._running = False

    def start(self, replicas: Iterable[R]) -> None:
        self._running = True
        for r in replicas:
            self._spawn(r, first_now=False)

    def add(self, replica: R) -> None:
        """A replica that joined: its first round runs at once (when started)."""
        if self._running and replica.name not in self._tasks:
            self._spawn(replica, first_now=True)

    def remove(self, name: str) -> None:
        """A replica that left: its task is cancelled (awaited by `stop`)."""
        task = self._tasks.pop(name, None)
        if task is not None:
            task.cancel()

    async def stop(self) -> None:
        self._running = False
        self._tasks.clear()
        await self._supervisor.stop()

    def __len__(self) -> int:
        return len(self._tasks)

    def _spawn(self, replica: R, *, first_now: bool) -> None:
        runs = 0

        def run() -> Coroutine[Any, Any, None]:
            # Only the first run may start at once: a restart waits its interval.
            nonlocal runs
            runs += 1
            return self._body(replica, first_now and runs == 1)

        self._tasks[replica.name] = self._supervisor.spawn(replica.name, run)
