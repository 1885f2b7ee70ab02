"""Background tasks with an owner: named, their crash logged, restarted.

`Supervisor.spawn(name, run)` starts `run()` as a task it keeps. A task that
raises is logged with its traceback and, unless it asked for no restart,
started again after a backoff (0.1 s doubling to 5 s, at most
`max_restarts` times in a row: a task that keeps crashing stays down,
logged). A task that returns is done. `stop()` cancels and awaits them all.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("gateway.supervise")

_BACKOFF_S = (0.1, 5.0)


class Supervisor:
    def __init__(self, owner: str, max_restarts: int = 10) -> None:
        self._owner = owner
        self._max_restarts = max_restarts
        self._tasks: set[asyncio.Task[None]] = set()

    def spawn(
        self, name: str, run: Callable[[], Awaitable[None]], *, restart: bool = True
    ) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(
            self._guarded(name, run, restart), name=f"{self._owner}:{name}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def stop(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _guarded(self, name: str, run: Callable[[], Awaitable[None]], restart: bool) -> None:
        delay = _BACKOFF_S[0]
        for attempt in range(self._max_restarts + 1):
            try:
                await run()
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                again = restart and attempt < self._max_restarts
                log.exception(
                    "%s: background task %s crashed%s",
                    self._owner,
                    name,
                    f"; restarting in {delay:.1f}s" if again else "; not restarted",
                )
                if not again:
                    return
            await asyncio.sleep(delay)
            delay = min(delay * 2, _BACKOFF_S[1])
