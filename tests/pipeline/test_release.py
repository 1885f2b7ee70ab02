"""Everything a request took is given back by `gateway.pipeline.release`, on
every way out: success, an error, a cancellation (client gone), the deadline."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest

from gateway.admission.controller import AdmissionController
from gateway.config.schema import AdmissionConfig, GatewayConfig, ReplicaConfig
from gateway.errors import DeadlineExceeded, UpstreamError
from gateway.pipeline import release
from gateway.policies.policyset import Policy, SessionSpec
from gateway.policy.budgets import Budgets
from gateway.replicas.registry import Replica, ReplicaRegistry
from gateway.request.context import RequestContext
from gateway.state import MemoryStateStore
from tests.ctxkit import make_ctx

POLICY = Policy(name="agent", session=SessionSpec(max_total_tokens=10_000))


async def _noop(message: Any) -> None:
    return None


def _setup() -> tuple[AdmissionController, list[Replica], Budgets, MemoryStateStore]:
    registry = ReplicaRegistry(
        (ReplicaConfig(url="http://r0:1", name="r0", capacity_tokens=10_000),)
    )
    for r in registry:
        r.health.healthy = True
    store = MemoryStateStore()
    ctl = AdmissionController(AdmissionConfig(max_engine_waiting=None), registry)
    return ctl, list(registry), Budgets(GatewayConfig(), store), store


def _ctx(deadline_in: float = 60.0) -> RequestContext:
    ctx = make_ctx(session="s", policy=POLICY, prompt=100, output=100, deadline_in=deadline_in)
    ctx.received_at = time.monotonic()
    return ctx


async def _hold(
    ctl: AdmissionController, reps: list[Replica], budgets: Budgets, ctx: RequestContext, body: Any
) -> None:
    async with (
        release.request(ctx, _noop, budgets),
        release.lease(ctl, ctx, reps) as lease,
    ):
        assert ctx.deadline is not None and ctx.deadline.timer is not None
        assert lease.replica.live is not None and lease.replica.live.in_flight == 1
        await body()


def _given_back(reps: list[Replica], store: MemoryStateStore, ctx: RequestContext) -> None:
    live = reps[0].live
    assert live is not None and (live.in_flight, live.leased_tokens) == (0, 0)
    assert store.live_reservations == 0
    assert ctx.deadline is not None and ctx.deadline.timer is None


async def _ok() -> None:
    return None


async def _fails() -> None:
    raise UpstreamError("boom", status=502)


async def _sleeps() -> None:
    await asyncio.sleep(30)


@pytest.mark.parametrize("body", [_ok, _fails])
def test_success_and_error_give_everything_back(body: Any) -> None:
    async def run() -> None:
        ctl, reps, budgets, store = _setup()
        ctx = _ctx()
        with contextlib.suppress(UpstreamError):
            await _hold(ctl, reps, budgets, ctx, body)
        _given_back(reps, store, ctx)

    asyncio.run(run())


def test_cancellation_gives_everything_back() -> None:
    async def run() -> None:
        ctl, reps, budgets, store = _setup()
        ctx = _ctx()
        task = asyncio.get_running_loop().create_task(_hold(ctl, reps, budgets, ctx, _sleeps))
        ctx.serving_task = task
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        _given_back(reps, store, ctx)

    asyncio.run(run())


def test_the_deadline_gives_everything_back() -> None:
    async def run() -> None:
        ctl, reps, budgets, store = _setup()
        ctx = _ctx(deadline_in=0.2)
        task = asyncio.get_running_loop().create_task(_hold(ctl, reps, budgets, ctx, _sleeps))
        ctx.serving_task = task
        with pytest.raises(DeadlineExceeded):
            await asyncio.wait_for(task, 10)
        _given_back(reps, store, ctx)

    asyncio.run(run())
