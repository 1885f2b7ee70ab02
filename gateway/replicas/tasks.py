"""One background task per replica (health checks, live-state polls), kept in
step with a replica set that changes at run time (`gateway.replicas.discovery`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, Generic, Protocol, TypeVar


class Named(Protocol):
    @property
    def name(self) -> str: ...


R = TypeVar("R", bound=Named)


class ReplicaTasks(Generic[R]):
    """`body(replica, first_now)`: the task's coroutine; `first_now` asks it to
    run its first round at once (a replica that joined at run time)."""

    def __init__(self, label: str, body: Callable[[R, bool], Coroutine[Any, Any, None]]) -> None:
        self._label = label
        self._body = body
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._ending: set[asyncio.Task[None]] = set()
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
            self._ending.add(task)
            task.add_done_callback(self._ending.discard)

    async def stop(self) -> None:
        self._running = False
        tasks = [*self._tasks.values(), *self._ending]
        self._tasks.clear()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def __len__(self) -> int:
        return len(self._tasks)

    def _spawn(self, replica: R, *, first_now: bool) -> None:
        self._tasks[replica.name] = asyncio.create_task(
            self._body(replica, first_now), name=f"{self._label}:{replica.name}"
        )
