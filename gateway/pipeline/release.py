"""Give back in one place: everything a request took, released on every path.

- the deadline timer: taken by `deadlines.arm`, stopped by `deadlines.disarm`
  when the request ends;
- the budget reservation (tenant limits and the session budget, one atomic
  store reservation): taken by `Budgets.take`, settled with what the request
  used by `Budgets.settle` (shielded) when the request ends;
- the admission lease: taken by `AdmissionController.take`, given back by
  `Lease.release` (a shared-store release shielded) when its attempt ends;
  its prefill claim ends earlier, at the first response byte;
- the upstream connection: the forwarder's own `async with`, closed unless
  its body was fully read.

Success, error, client gone (the task cancelled), deadline or shutdown: each
is a way out of these blocks, and each block gives back what it took in its
`finally`. The owners say what giving back means; this module says when.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from gateway.admission.controller import AdmissionController
from gateway.admission.ledger import Lease
from gateway.deadlines import deadline as deadlines
from gateway.forward.forwarder import Send
from gateway.policy.budgets import Budgets
from gateway.replicas.registry import Replica
from gateway.request.context import RequestContext
from gateway.state.base import Rider


@contextlib.asynccontextmanager
async def request(
    ctx: RequestContext, send: Send, budgets: Budgets, rider: Rider | None = None
) -> AsyncIterator[Send]:
    """The request's timer and budget reservation, held around its dispatch;
    yields the `send` that moves the timer once the response starts."""
    async with timer(ctx, send) as timed_send, reservation(budgets, ctx, rider):
        yield timed_send


@contextlib.asynccontextmanager
async def timer(ctx: RequestContext, send: Send) -> AsyncIterator[Send]:
    """The request's one timer, armed for the block and enforced on it
    (`deadlines.enforce`: DeadlineExceeded or ShuttingDown)."""
    deadlines.arm(ctx)
    try:
        async with deadlines.enforce(ctx, send) as timed_send:
            yield timed_send
    finally:
        deadlines.disarm(ctx)


@contextlib.asynccontextmanager
async def reservation(
    budgets: Budgets, ctx: RequestContext, rider: Rider | None = None
) -> AsyncIterator[None]:
    """The budget reservation (RateLimited on entry if a limit is reached),
    carrying the rider's reads in and its writes out."""
    held = await budgets.take(ctx, rider)
    try:
        yield
    finally:
        if held is not None:
            await asyncio.shield(budgets.settle(ctx, held, rider))


@contextlib.asynccontextmanager
async def lease(
    admission: AdmissionController, ctx: RequestContext, ranked: list[Replica]
) -> AsyncIterator[Lease]:
    """One attempt's admission lease; an attempt that succeeded teaches the
    output estimator what the request used."""
    taken = await admission.take(ctx, ranked)
    try:
        yield taken
    finally:
        await taken.release()
    admission.estimator.learn(ctx)
