"""State machine: the ledger never admits beyond a replica's capacity under any
interleaving, both in-process (the trackers are the ledger) and through a
shared store (every lease is also a reservation)."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from gateway.admission.controller import AdmissionController
from gateway.admission.ledger import Lease, SharedLease, keys
from gateway.config.schema import AdmissionConfig, ReplicaConfig
from gateway.engines.readings import EngineReading
from gateway.replicas.registry import Replica, ReplicaRegistry
from gateway.request.context import RequestContext
from gateway.state import MemoryStateStore
from tests.ctxkit import make_ctx

CAP = 10_000
MAX_IN_FLIGHT = 6
CFG = AdmissionConfig(max_in_flight=MAX_IN_FLIGHT, max_engine_waiting=None)


def _ctx(prompt: int, output: int, cls: str) -> RequestContext:
    return make_ctx(prompt=prompt, output=output, priority=cls, deadline_in=1e9, received_at=0.0)


class SharedMemoryStore(MemoryStateStore):
    """The in-process store presented as shared, as a Redis store would be."""

    shared = True


class LedgerMachine(RuleBasedStateMachine):
    leases = Bundle("leases")
    store_class: type[MemoryStateStore] = MemoryStateStore

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.now = 0.0
        self.store = self.store_class(clock=lambda: self.now)
        self.registry = ReplicaRegistry(
            (
                ReplicaConfig(url="http://a:1", name="a", capacity_tokens=CAP),
                ReplicaConfig(url="http://b:1", name="b", capacity_tokens=CAP // 2),
            )
        )
        for r in self.registry:
            r.health.healthy = True
        self.ctl = AdmissionController(CFG, self.registry, self.store, clock=lambda: self.now)
        self.held: list[Lease] = []

    def run(self, aw: Any) -> Any:
        return self.loop.run_until_complete(aw)

    @rule(
        target=leases,
        prompt=st.integers(1, 6000),
        output=st.integers(0, 3000),
        cls=st.sampled_from(["interactive", "standard", "batch"]),
    )
    def reserve(self, prompt: int, output: int, cls: str) -> Any:
        lease = self.run(self.ctl._try_ranked(_ctx(prompt, output, cls), list(self.registry), cls))
        if lease is not None:
            assert isinstance(lease, SharedLease) is self.store.shared
            self.held.append(lease)
        return lease

    @rule(lease=consumes(leases))
    def release(self, lease: Lease | None) -> None:
        if lease is not None:
            self.run(lease.close())
            self.held.remove(lease)

    @rule(lease=leases)
    def first_token(self, lease: Lease | None) -> None:
        if isinstance(lease, SharedLease):
            self.run(lease._end_prefill())
        elif lease is not None:
            lease.first_byte()

    @rule(frac=st.floats(0, 1), name=st.sampled_from(["a", "b"]))
    def engine_reports_usage(self, frac: float, name: str) -> None:
        replica = self.registry.get(name)
        assert replica is not None
        t = self.ctl.trackers[name]
        replica.ledger.live = t.observe(
            EngineReading(capacity_tokens=CAP, used_tokens=int(frac * CAP)), self.now
        )

    @rule(dt=st.floats(0, 5))
    def time_passes(self, dt: float) -> None:
        self.now += dt

    @invariant()
    def never_over_capacity(self) -> None:
        for r in self.registry:
            mine = [x for x in self.held if x.replica is r]
            kv, prefill, inflight = (
                r.live.leased_tokens,
                r.live.prefill_backlog_tokens,
                r.live.in_flight,
            )
            if self.store.shared:
                assert self.run(self.store.get(keys(r.name))) == [kv, prefill, inflight]
            else:
                assert self.run(self.store.get(keys(r.name))) == [0, 0, 0]  # never touched
            cap = r.config.capacity_tokens
            assert cap is not None
            assert kv == sum(x.kv_held for x in mine) <= cap
            biggest = max((x.kv_held for x in mine), default=0)
            assert kv <= max(
                int(0.92 * cap), biggest
            )  # over the top watermark only as a lone lease
            assert prefill == sum(x.prefill_held for x in mine) >= 0
            assert inflight == len(mine) == r.in_flight <= MAX_IN_FLIGHT

    def teardown(self) -> None:
        for lease in list(self.held):
            self.run(lease.close())
        for r in self.registry:
            assert self.run(self.store.get(keys(r.name))) == [0, 0, 0]
            assert (r.live.leased_tokens, r.live.prefill_backlog_tokens, r.live.in_flight) == (
                0,
                0,
                0,
            )
        assert self.store.live_reservations == 0
        self.loop.close()


class SharedLedgerMachine(LedgerMachine):
    store_class = SharedMemoryStore


TestLedger = LedgerMachine.TestCase
TestLedger.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestSharedLedger = SharedLedgerMachine.TestCase
TestSharedLedger.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


class _RemoteStore:
    """A store without an in-process release (like Redis): closing must await."""

    shared = True

    def __init__(self) -> None:
        self.inner = MemoryStateStore()

    def release_now(self, reservation: Any) -> bool:
        return False

    async def reserve(self, claims: Any, ttl_s: float) -> Any:
        return await self.inner.reserve(claims, ttl_s)

    async def release(self, reservation: Any) -> None:
        await asyncio.sleep(0)
        await self.inner.release(reservation)


def test_close_now_releases_in_process_and_defers_otherwise() -> None:
    async def scenario() -> None:
        changes: list[tuple[int, int, int]] = []

        def on_change(lease: Lease, kv: int, prefill: int, inflight: int) -> None:
            changes.append((kv, prefill, inflight))

        from gateway.admission.ledger import Demand, Limits, claims

        demand = Demand(100, 50, 100)
        replica = Replica(ReplicaConfig(url="http://127.0.0.1:9", name="a"))
        for store, expect_now in ((MemoryStateStore(), True), (_RemoteStore(), False)):
            res = (
                await store.reserve(claims("a", demand, Limits(None, None, None)), 60)
            ).reservation
            lease = SharedLease(replica, demand, store, res, 60, on_change)
            assert lease.close_now() is expect_now
            if not expect_now:
                await lease.close()
            inner = store if isinstance(store, MemoryStateStore) else store.inner
            assert inner.live_reservations == 0
            assert lease.close_now() is True  # idempotent once closed
        # A prefill swap under way: close_now defers to close, which waits for it.
        store = MemoryStateStore()
        res = (await store.reserve(claims("a", demand, Limits(None, None, None)), 60)).reservation
        lease = SharedLease(replica, demand, store, res, 60, on_change)
        lease.first_byte()
        assert lease.close_now() is False
        await lease.close()
        assert store.live_reservations == 0
        assert sum(c[0] for c in changes) == 0 and sum(c[2] for c in changes) == 0

    asyncio.run(scenario())
