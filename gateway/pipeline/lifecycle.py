"""Shutdown: drain the requests in flight, then end what is left with a word.

On SIGTERM or SIGINT (`gateway serve` wires the signals through
`gateway.http.serving.serve_all`) the listeners stop accepting connections
and `Lifecycle.drain` runs:

1. `draining` turns true at once: `/readyz` answers 503 and a request that
   still arrives (on a connection already open) is refused with 503
   `shutting_down` and `Retry-After`, before any engine work.
2. The requests in flight get `listen.graceful_timeout_s` to finish.
3. Whatever still runs then is interrupted through its deadline timer
   (`deadlines.interrupt`): a stream ends with an SSE error event
   (`code: shutting_down`) and `data: [DONE]`, a request whose answer has
   not started (queued, or waiting for its first byte) gets 503
   `shutting_down` with `Retry-After`. Their upstream exchanges are closed
   (the engine frees their KV) and their leases and budget reservations are
   released as their `async with` blocks unwind.
"""

from __future__ import annotations

import asyncio
import logging

from gateway.deadlines import deadline as deadlines
from gateway.request.context import RequestContext

log = logging.getLogger("gateway.lifecycle")

#: how often the drain looks at what is still in flight (seconds)
_POLL_S = 0.05
#: after the interruption, how long the interrupted requests get to answer
_ANSWER_S = 2.0


class Lifecycle:
    """The requests in flight, and the gateway's drain on shutdown."""

    __slots__ = ("_inflight", "draining", "ended")

    def __init__(self) -> None:
        self.draining = False  # no new request from now on
        self.ended = False  # the grace period is over: nothing more runs
        self._inflight: set[RequestContext] = set()

    def enter(self, ctx: RequestContext) -> None:
        self._inflight.add(ctx)

    def leave(self, ctx: RequestContext) -> None:
        self._inflight.discard(ctx)

    async def drain(self, grace_s: float) -> int:
        """Refuse new requests, let those in flight finish for up to `grace_s`
        seconds, then interrupt the rest. Returns how many were interrupted."""
        self.draining = True
        log.info(
            "shutting down: %d request(s) in flight, %.1fs to finish", len(self._inflight), grace_s
        )
        await self._wait_idle(grace_s)
        self.ended = True
        interrupted = sum(1 for ctx in list(self._inflight) if deadlines.interrupt(ctx))
        if interrupted:
            log.warning(
                "shutting down: ended %d request(s) still running after %.1fs",
                interrupted,
                grace_s,
            )
            await self._wait_idle(_ANSWER_S)
        return interrupted

    async def _wait_idle(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        until = loop.time() + seconds
        while self._inflight and loop.time() < until:
            await asyncio.sleep(min(_POLL_S, max(0.0, until - loop.time())))
