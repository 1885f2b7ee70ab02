"""The timeouts of one lean-server connection: one timer, re-armed lazily.

Never a task or a timer per request: each connection has one `TimerHandle`,
and a firing that comes early (the deadline moved on since it was armed)
re-arms it. What the timer watches is the connection's phase:

- `IDLE`: no byte of a next request for `idle_timeout` seconds since the
  last response (a connection never used: `head_timeout`, if shorter) → close;
- `HEAD`: a request head must be complete within `head_timeout` of its first
  byte → close;
- `BODY`: a request body must not pause for more than `body_timeout` between
  two bytes nor take more than `body_total_timeout` in all (a stalled
  `Content-Length` body, a chunked body without its final chunk,
  `Expect: 100-continue` and no body) → the connection answers `408`;
- `BUSY`: a request is being answered → no timeout.

Time during which the server itself does not read (a pipelined request
waiting its turn, an app not reading its body, a `100 Continue` not yet
sent) does not count against the client: the connection says so through
`holding_body()`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final, Protocol

from gateway.http.server_state import ServerState

__all__ = ["BODY", "BUSY", "HEAD", "IDLE", "ConnectionTimer", "Timed"]

IDLE: Final = 0
HEAD: Final = 1
BODY: Final = 2
BUSY: Final = 3
_SLACK: Final = 0.001  # a timer firing this early counts as on time


class Timed(Protocol):
    """What the timer asks of its connection."""

    def holding_body(self) -> bool:
        """The server is not reading the body (or not asking for it yet)."""
        ...

    def timed_out(self, phase: int, message: str) -> None: ...


class ConnectionTimer:
    """The phase of one connection and its deadline (see the module doc)."""

    __slots__ = ("_conn", "_due", "_handle", "_loop", "_state", "fresh", "last", "phase", "since")

    def __init__(self, conn: Timed, state: ServerState) -> None:
        self._conn = conn
        self._state = state
        self._loop = state.loop
        self.phase = IDLE
        self.fresh = False  # in IDLE: no request yet on this connection
        self.since = 0.0  # when the current phase began
        self.last = 0.0  # when the last body byte arrived (phase `BODY`)
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0  # when `_handle` fires

    def _arm(self, due: float) -> None:
        """Make sure the timer fires at `due` at the latest (one firing earlier re-arms)."""
        handle = self._handle
        if handle is not None:
            if self._due <= due:
                return
            handle.cancel()
        self._due = due
        self._handle = self._loop.call_at(due, self._check)

    def idle(self, head_begun: bool, fresh: bool = False) -> None:
        """The connection waits for a next request (whose head may have begun
        already); a `fresh` one (never used) for its first at most `head_timeout`."""
        now = self.since = self._loop.time()
        if head_begun:
            self.phase = HEAD
            self._arm(now + self._state.head_timeout)
        else:
            self.phase = IDLE
            self.fresh = fresh
            self._arm(now + self._idle_timeout())

    def _idle_timeout(self) -> float:
        state = self._state
        return min(state.idle_timeout, state.head_timeout) if self.fresh else state.idle_timeout

    def head_begins(self) -> None:
        self.phase = HEAD
        now = self.since = self._loop.time()
        self._arm(now + self._state.head_timeout)

    def body_begins(self) -> None:
        """A request's body is incomplete at the end of a read: time it."""
        now = self.since = self.last = self._loop.time()
        self.phase = BODY
        state = self._state
        self._arm(now + min(state.body_timeout, state.body_total_timeout))

    def busy(self) -> None:
        """A request is being answered."""
        self.phase = BUSY

    def body_done(self) -> None:
        if self.phase == BODY:
            self.phase = BUSY

    def touch(self) -> None:
        """The client's request moved on (its bytes arrived, or a `100 Continue` went out)."""
        now = self.last = self._loop.time()
        if self.phase == IDLE:
            self.since = now

    def call_later(self, delay: float, callback: Callable[[], object]) -> None:
        """Replace the timeouts by one last call (the connection is closing)."""
        self.cancel()
        self._handle = self._loop.call_later(delay, callback)

    def cancel(self) -> None:
        self.phase = BUSY
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _check(self) -> None:
        self._handle = None
        phase = self.phase
        if phase == BUSY:
            return  # the next phase that needs one arms a new timer
        state = self._state
        now = self._loop.time()
        if phase == IDLE:
            due = self.since + self._idle_timeout()
        elif phase == HEAD:
            due = self.since + state.head_timeout
        else:
            if self._conn.holding_body():  # not the client's stall
                self.last = now
                self.since = max(self.since, now + state.body_timeout - state.body_total_timeout)
            due = min(self.last + state.body_timeout, self.since + state.body_total_timeout)
        if now < due - _SLACK:
            self._arm(due)
        else:
            self._conn.timed_out(phase, self._reason(phase, now))

    def _reason(self, phase: int, now: float) -> str:
        if phase == IDLE:
            return "idle connection"
        if phase == HEAD:
            return "request head not complete in time"
        state = self._state
        total = now - self.since >= state.body_total_timeout - _SLACK
        limit = state.body_total_timeout if total else state.body_timeout
        what = "not complete within" if total else "stalled for"
        return f"Request body {what} {limit:g} s: closing."
