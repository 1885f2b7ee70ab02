"""One timer per request for its deadline and the current exchange phase.

A request is bounded by its deadline (`gateway.deadlines.deadline`) and, while
talking to an engine, by the timeout of the current phase: connect, first
byte, and the idle gap before every stream chunk. With `asyncio.timeout`
each of those is its own event-loop timer (on uvloop, a libuv timer handle
allocated and freed each time), so a 200-chunk stream armed and cancelled
~200 timers. Here one timer serves the whole request: moving a bound later
only records the new instant, and the timer, when it fires early, re-arms
itself for the instant now due. Moving a bound earlier re-arms at once.

On expiry the request's task is cancelled, as `asyncio.timeout` does; the
code that waits converts the cancellation into its own error (`expired`
says which bound fired) and uncancels the task, so a client disconnect or
a shutdown arriving at the same time is never swallowed.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable
from typing import Any, TypeVar

T = TypeVar("T")

#: re-arm only when the due instant is this much later than the current timer (seconds)
_SLACK_S = 0.001


class RequestTimer:
    __slots__ = (
        "_armed_at",
        "_cancelling",
        "_handle",
        "_loop",
        "_task",
        "deadline",
        "expired",
        "phase_at",
        "phase_s",
        "phase_what",
    )

    def __init__(
        self, deadline: float, horizon_s: float = math.inf, task: asyncio.Task[Any] | None = None
    ) -> None:
        """`deadline`: the request's bound in loop time (`loop.time()`).
        `horizon_s`: no phase bound will be shorter than this; the timer is
        first armed that far ahead (or at the deadline if earlier), so the
        phases that follow never re-arm it (a request outliving the horizon
        wakes it once, and it re-arms for what is then due)."""
        task = task or asyncio.current_task()
        if task is None:
            raise RuntimeError("RequestTimer must be created inside a task")
        self._task = task
        self._loop = asyncio.get_running_loop()
        self._cancelling = task.cancelling()
        self.deadline = deadline
        self.phase_at = math.inf
        self.phase_what = ""
        self.phase_s = 0.0
        self.expired: str | None = None  # "deadline" | "phase" | `interrupt`'s kind once fired
        self._armed_at = min(deadline, self._loop.time() + horizon_s)
        self._handle: asyncio.TimerHandle | None = self._loop.call_at(self._armed_at, self._fire)

    # --- bounds -------------------------------------------------------------

    def set_deadline(self, when: float) -> None:
        self.deadline = when
        self._due_changed()

    def start_phase(self, seconds: float, what: str) -> None:
        """Bound what follows by `seconds` from now (replacing any earlier phase)."""
        self.phase_at = self._loop.time() + seconds
        self.phase_s, self.phase_what = seconds, what
        self._due_changed()

    def end_phase(self) -> None:
        self.phase_at = math.inf

    def _due(self) -> float:
        return min(self.deadline, self.phase_at)

    def _due_changed(self) -> None:
        if self.expired is None and self._handle is not None and self._due() < self._armed_at:
            self._arm(self._due())

    def _arm(self, when: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._armed_at = when
        self._handle = self._loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self._handle = None
        due = self._due()
        if due > self._loop.time() + _SLACK_S:
            self._arm(due)  # a bound moved later since this timer was set
            return
        self.expired = "deadline" if self.deadline <= self.phase_at else "phase"
        self._task.cancel()

    def interrupt(self, kind: str) -> bool:
        """End the request now for `kind` (e.g. "shutdown"), as an expiry would:
        the task is cancelled and `claim(kind)` recognises the cancellation.
        False when the timer already fired or was closed."""
        if self.expired is not None or self._handle is None:
            return False
        self._handle.cancel()
        self._handle = None
        self.expired = kind
        self._task.cancel()
        return True

    # --- ending ---------------------------------------------------------------

    def claim(self, kind: str) -> bool:
        """True when the timer fired for `kind` and this cancellation is the
        timer's own (then the task is uncancelled: the caller raises its error)."""
        if self.expired != kind:
            return False
        return self._task.uncancel() <= self._cancelling

    def resume(self) -> None:
        """After a phase expiry was claimed: keep bounding the request by its deadline."""
        self.expired = None
        self._arm(self._due())

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


async def phase(timer: RequestTimer, aw: Awaitable[T], seconds: float, what: str) -> T:
    """Await `aw` bounded by `seconds`; `TimeoutError` when that phase bound fires
    (a deadline firing meanwhile propagates as the cancellation it is)."""
    timer.start_phase(seconds, what)
    try:
        return await aw
    except asyncio.CancelledError:
        if timer.claim("phase"):
            timer.end_phase()
            timer.resume()
            raise TimeoutError(what) from None
        raise
    finally:
        timer.end_phase()
