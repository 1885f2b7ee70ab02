"""The admission controller in-process: queue order, shedding, cancellation, wake-ups."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import pytest

from gateway.admission.controller import AdmissionController
from gateway.config.schema import AdmissionConfig, ReplicaConfig
from gateway.engines.readings import EngineReading
from gateway.errors import BadRequest, Overloaded
from gateway.pipeline import release
from gateway.replicas.registry import Replica, ReplicaRegistry
from gateway.request.context import RequestContext
from tests.ctxkit import make_ctx

CAP = 10_000


def ctx(
    prompt: int = 1000, output: int = 1000, cls: str = "standard", timeout: float = 60.0
) -> RequestContext:
    return make_ctx(prompt=prompt, output=output, priority=cls, deadline_in=timeout)


def sync(fn: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    """Run an async test body on a fresh event loop (no pytest-asyncio here)."""

    @functools.wraps(fn)
    def run() -> None:
        asyncio.run(fn())

    return run


class Harness:
    """Runs requests that hold their lease until their gate opens; records admission order."""

    def __init__(self, ctl: AdmissionController, ranked: list[Replica]) -> None:
        self.ctl, self.ranked = ctl, ranked
        self.order: list[str] = []
        self.gates: dict[str, asyncio.Event] = {}

    async def hold(self, name: str, c: RequestContext) -> None:
        gate = self.gates.setdefault(name, asyncio.Event())
        async with release.lease(self.ctl, c, self.ranked):
            self.order.append(name)
            await gate.wait()

    def start(self, name: str, c: RequestContext) -> asyncio.Task[None]:
        self.gates.setdefault(name, asyncio.Event())
        return asyncio.get_running_loop().create_task(self.hold(name, c))


@contextlib.asynccontextmanager
async def harness(ctl: AdmissionController, ranked: list[Replica]) -> AsyncIterator[Harness]:
    h = Harness(ctl, ranked)
    try:
        yield h
    finally:
        for g in h.gates.values():
            g.set()
        await settle()


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def setup(
    cfg: AdmissionConfig | None = None, caps: tuple[int | None, ...] = (CAP,)
) -> tuple[AdmissionController, list[Replica]]:
    registry = ReplicaRegistry(
        tuple(
            ReplicaConfig(url=f"http://r{i}:1", name=f"r{i}", capacity_tokens=c)
            for i, c in enumerate(caps)
        )
    )
    for r in registry:
        r.health.healthy = True
    return AdmissionController(cfg or AdmissionConfig(max_engine_waiting=None), registry), list(
        registry
    )


@sync
async def test_interactive_jumps_a_queue_full_of_batch() -> None:
    ctl, reps = setup()
    async with harness(ctl, reps) as h:
        h.start("first", ctx(4000, 4000, "interactive"))  # 8000 of 10000: batch (0.70) cannot fit
        await settle()
        for i in range(5):
            h.start(f"batch{i}", ctx(500, 500, "batch"))
        await settle()
        assert ctl.queue.stats["batch"].length == 5
        h.start("vip", ctx(500, 500, "interactive"))  # 9000 ≤ 0.92 × 10000: admitted at once
        await settle()
        assert h.order == ["first", "vip"]
        h.gates["first"].set()
        await settle()
        assert (
            h.order[:2] == ["first", "vip"] and len(h.order) == 7
        )  # then the batch ones, in order
        assert h.order[2:] == [f"batch{i}" for i in range(5)]


@sync
async def test_interactive_admitted_before_queued_batch_when_room_frees() -> None:
    ctl, reps = setup(AdmissionConfig(max_engine_waiting=None, max_in_flight=1))
    async with harness(ctl, reps) as h:
        h.start("first", ctx(100, 100, "batch"))
        await settle()
        for i in range(3):
            h.start(f"batch{i}", ctx(100, 100, "batch"))
        await settle()
        h.start("vip", ctx(100, 100, "interactive"))
        await settle()
        assert h.order == ["first"] and len(ctl.queue) == 4
        h.gates["first"].set()
        await settle()
        assert h.order == ["first", "vip"]


@sync
async def test_queue_full_sheds_with_retry_after() -> None:
    cfg = AdmissionConfig(
        max_engine_waiting=None, max_in_flight=1, queue_max_requests={"standard": 2}
    )
    ctl, reps = setup(cfg)
    async with harness(ctl, reps) as h:
        for i in range(3):
            h.start(f"s{i}", ctx())
        await settle()
        with pytest.raises(Overloaded) as info:
            async with release.lease(ctl, ctx(), reps):
                pass
        assert info.value.status == 503 and info.value.reason == "queue_full"
        assert info.value.retry_after is not None and info.value.retry_after >= 1


@sync
async def test_bigger_than_any_replica_is_400_at_once() -> None:
    ctl, reps = setup(caps=(CAP, CAP // 2))
    with pytest.raises(BadRequest) as info:
        async with release.lease(ctl, ctx(9000, 2000), reps):
            pass
    assert info.value.status == 400 and info.value.reason == "exceeds_capacity"
    assert len(ctl.queue) == 0


@sync
async def test_lone_request_above_watermark_is_admitted_on_an_idle_replica() -> None:
    ctl, reps = setup()
    async with release.lease(ctl, ctx(6000, 3500, "batch"), reps) as lease:
        assert lease.replica is reps[0]


@sync
async def test_cancelled_waiter_leaves_the_queue_at_once() -> None:
    ctl, reps = setup(AdmissionConfig(max_engine_waiting=None, max_in_flight=1))
    async with harness(ctl, reps) as h:
        h.start("first", ctx())
        await settle()
        waiter = h.start("second", ctx())
        await settle()
        assert len(ctl.queue) == 1
        waiter.cancel()
        await settle()
        assert len(ctl.queue) == 0 and ctl.queue.stats["standard"].tokens == 0
        h.gates["first"].set()
        await settle()
        assert h.order == ["first"]
        assert reps[0].live.in_flight == 0 and reps[0].live.leased_tokens == 0


@sync
async def test_early_shed_when_the_deadline_cannot_cover_the_ttft() -> None:
    cfg = AdmissionConfig(
        max_engine_waiting=None, max_in_flight=1, default_prefill_tokens_per_s=1000.0
    )
    ctl, reps = setup(cfg)
    async with harness(ctl, reps) as h:
        h.start("first", ctx(100, 100))
        await settle()
        # 2000 prefill tokens at 1000 tok/s need 2 s; only 0.5 s left: shed now,
        # not at the deadline.
        t0 = time.monotonic()
        with pytest.raises(Overloaded) as info:
            async with release.lease(ctl, ctx(2000, 10, timeout=0.5), reps):
                pass
        assert info.value.reason == "deadline_unreachable"
        assert time.monotonic() - t0 < 0.4
        assert len(ctl.queue) == 0


@sync
async def test_fresh_metrics_wake_the_queue() -> None:
    ctl, reps = setup()
    r = reps[0]
    t = ctl.trackers[r.name]
    r.ledger.live = t.observe(
        EngineReading(capacity_tokens=CAP, used_tokens=9500), time.monotonic()
    )
    task = asyncio.get_running_loop().create_task(_acquire_once(ctl, reps, ctx(1000, 1000)))
    await settle()
    assert len(ctl.queue) == 1  # external traffic fills the engine
    r.ledger.live = t.observe(
        EngineReading(capacity_tokens=CAP, used_tokens=1000), time.monotonic()
    )
    ctl.on_update(r)
    assert await asyncio.wait_for(task, 5) == "r0"


async def _acquire_once(ctl: AdmissionController, reps: list[Replica], c: RequestContext) -> str:
    async with release.lease(ctl, c, reps) as lease:
        return lease.replica.name


@sync
async def test_first_byte_ends_the_prefill_claim() -> None:
    cfg = AdmissionConfig(
        max_engine_waiting=None,
        default_prefill_tokens_per_s=1000.0,
        ttft_targets_s={"standard": 1.0},
    )
    ctl, reps = setup(cfg)
    c1 = ctx(900, 10)
    async with release.lease(ctl, c1, reps):
        assert reps[0].live.prefill_backlog_tokens == 900
        assert not ctl.can_admit(ctx(500, 10), reps[0])  # 1400 > 1 s × 1000 tok/s
        assert c1.admission.on_first_byte is not None
        c1.admission.on_first_byte()  # the forwarder calls it when the first byte arrives
        await settle()
        assert reps[0].live.prefill_backlog_tokens == 0
        assert ctl.can_admit(ctx(500, 10), reps[0])
        assert reps[0].live.leased_tokens == 910
    assert reps[0].live.leased_tokens == 0 and reps[0].in_flight == 0


@sync
async def test_second_replica_takes_what_the_first_cannot() -> None:
    ctl, reps = setup(caps=(CAP, CAP))
    async with (
        release.lease(ctl, ctx(4000, 4000), reps) as a,
        release.lease(ctl, ctx(4000, 4000), reps) as b,
    ):
        assert (a.replica.name, b.replica.name) == ("r0", "r1")


@sync
async def test_disabled_admission_takes_first_healthy_and_counts() -> None:
    ctl, reps = setup(AdmissionConfig(enabled=False), caps=(100, 100))
    reps[0].health.healthy = False
    async with (
        release.lease(ctl, ctx(4000, 4000), reps) as a,
        release.lease(ctl, ctx(4000, 4000), reps) as b,
    ):
        assert a.replica is b.replica is reps[1]
        assert reps[1].in_flight == 2 and reps[1].live.in_flight == 2
    assert reps[1].in_flight == 0


@sync
async def test_unknown_capacity_bounds_in_flight() -> None:
    ctl, reps = setup(
        AdmissionConfig(max_engine_waiting=None, unknown_capacity_max_in_flight=2), caps=(None,)
    )
    async with release.lease(ctl, ctx(), reps), release.lease(ctl, ctx(), reps):
        assert not ctl.can_admit(ctx(), reps[0])


@sync
async def test_lease_granted_to_a_waiter_cancelled_at_the_same_moment_is_returned() -> None:
    ctl, reps = setup(AdmissionConfig(max_engine_waiting=None, max_in_flight=1))
    cm = release.lease(ctl, ctx(), reps)
    lease = await cm.__aenter__()
    async with harness(ctl, reps) as h:
        waiter = h.start("waiter", ctx())
        await settle()
        assert len(ctl.queue) == 1
        await lease.close()  # wakes the dispatcher...
        assert ctl._pump_task is not None
        await ctl._pump_task  # ...which grants the waiter a lease
        waiter.cancel()  # before the waiter ran again
        await settle()
        assert waiter.cancelled() and h.order == []
    await cm.__aexit__(None, None, None)
    assert (
        reps[0].live.in_flight == 0 and reps[0].live.leased_tokens == 0 and reps[0].in_flight == 0
    )
