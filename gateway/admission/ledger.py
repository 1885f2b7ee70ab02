"""The token ledger: what each admitted request holds on its replica.

Three counters per replica: KV tokens, prefill backlog, requests in flight.
With an in-process store (one gateway) the admission trackers hold them:
the check "does it still fit?" and the update run without suspending, so
they are atomic on the event loop (`Lease`). With a store that several
gateway instances share, a lease is also one atomic `reserve` with a claim
on each counter (`adm:{<replica>}:kv|prefill|inflight`), so the instances
never oversubscribe together (`SharedLease`).

When the first response byte arrives the prefill work is done: the lease
drops its prefill claim (a shared lease swaps its reservation for one
without it: reserve the rest unconditionally, then release the old one, so
the backlog is briefly over-counted, never under-counted). `close` releases
whatever is held; it is idempotent and runs in `finally` on every path.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import NamedTuple

from gateway.errors import StateUnavailable
from gateway.replicas.registry import Replica
from gateway.state import Claim, Reservation, StateStore, TextWrite


class Demand(NamedTuple):
    """What one request needs on a replica, in tokens (a NamedTuple: built on
    every admission decision)."""

    prompt_tokens: int
    output_tokens: int
    prefill_tokens: int

    @property
    def kv_tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens


class Limits(NamedTuple):
    """Counter limits for one reserve, computed at decision time (None: unbounded)."""

    kv: int | None
    prefill: int | None
    in_flight: int | None


@functools.lru_cache(maxsize=1024)
def keys(replica: str) -> tuple[str, str, str]:
    """The replica's three counters; `{...}` keeps them in one Redis Cluster slot."""
    base = "adm:{" + replica.replace("{", "(").replace("}", ")") + "}:"
    return base + "kv", base + "prefill", base + "inflight"


def claims(replica: str, demand: Demand, limits: Limits) -> list[Claim]:
    kv, prefill, inflight = keys(replica)
    out = [Claim(kv, demand.kv_tokens, limits.kv), Claim(inflight, 1, limits.in_flight)]
    if demand.prefill_tokens > 0:
        out.append(Claim(prefill, demand.prefill_tokens, limits.prefill))
    return out


Delta = Callable[["Lease", int, int, int], None]  # (lease, Δkv, Δprefill, Δin-flight)


class Lease:
    """Tokens held on `replica`; `.replica` is what the pipeline forwards to.

    This base class is the in-process ledger: with an in-process store no
    other gateway reserves on these replicas, so the counters the admission
    trackers keep (fed through `on_change`) are the whole ledger, checked and
    updated without suspending. `held=False` is a pass-through lease
    (admission disabled): nothing is held, but in-flight counts are still
    reported. `SharedLease` holds the same amounts in a shared `StateStore`.
    """

    __slots__ = ("_on_change", "closed", "demand", "kv_held", "prefill_held", "replica")

    def __init__(
        self, replica: Replica, demand: Demand, on_change: Delta, held: bool = True
    ) -> None:
        self.replica = replica
        self.demand = demand
        self._on_change = on_change
        self.prefill_held = demand.prefill_tokens if held else 0
        self.kv_held = demand.kv_tokens if held else 0
        self.closed = False
        on_change(self, self.kv_held, self.prefill_held, 1)

    def carry(self, writes: list[TextWrite]) -> bool:
        """Apply `writes` (a list the caller may still append to) in the same
        store call as the release; False: this lease makes no store call."""
        return False

    def first_byte(self) -> None:
        """Sync hook run when the first response byte arrives: the prefill is done."""
        if self.prefill_held and not self.closed:
            held, self.prefill_held = self.prefill_held, 0
            self._on_change(self, 0, -held, 0)

    def close_now(self) -> bool:
        """Release at once if nothing can interleave; False: use `close`."""
        if not self.closed:
            self.closed = True
            self._give_back()
        return True

    async def close(self) -> None:
        """Release everything held; idempotent."""
        self.close_now()

    async def release(self) -> None:
        """Give the lease back; a shared-store release is shielded so that a
        cancellation arriving meanwhile cannot leave it half done."""
        if not self.close_now():
            await asyncio.shield(self.close())

    def _give_back(self) -> None:
        kv, prefill = self.kv_held, self.prefill_held
        self.kv_held = self.prefill_held = 0
        self._on_change(self, -kv, -prefill, -1)


class SharedLease(Lease):
    """A lease whose amounts are also held as one reservation in a `StateStore`
    that other gateway instances share (`res`), expiring after `ttl_s` unless
    released, so a crashed holder cannot leak capacity."""

    __slots__ = ("_lock_", "_res", "_store", "_task", "_ttl_s", "_writes")

    def __init__(
        self,
        replica: Replica,
        demand: Demand,
        store: StateStore,
        res: Reservation,
        ttl_s: float,
        on_change: Delta,
    ) -> None:
        self._store = store
        self._res: Reservation | None = res
        self._ttl_s = ttl_s
        self._lock_: asyncio.Lock | None = None  # only a prefill swap needs one
        self._task: asyncio.Task[None] | None = None
        self._writes: list[TextWrite] = []
        super().__init__(replica, demand, on_change)

    def carry(self, writes: list[TextWrite]) -> bool:
        self._writes = writes
        return True

    @property
    def _lock(self) -> asyncio.Lock:
        if self._lock_ is None:
            self._lock_ = asyncio.Lock()
        return self._lock_

    def first_byte(self) -> None:
        if self.prefill_held and self._task is None and not self.closed:
            self._task = asyncio.get_running_loop().create_task(self._end_prefill())

    async def _end_prefill(self) -> None:
        async with self._lock:
            if self.closed or self._res is None:
                return
            rest = [
                Claim(c.key, c.amount) for c in self._res.claims if not c.key.endswith(":prefill")
            ]
            try:
                new = await self._store.reserve(rest, self._ttl_s)
            except StateUnavailable:
                return  # the prefill claim stays held until the lease closes
            old, self._res = self._res, new.reservation
            await self._store.release(old)
            held, self.prefill_held = self.prefill_held, 0
            self._on_change(self, 0, -held, 0)

    def close_now(self) -> bool:
        """Release at once when nothing can interleave (no prefill swap under way,
        a store that releases without suspending); False: use `close`."""
        if self.closed:
            return True
        swapping = self._task is not None and not self._task.done()
        locked = self._lock_ is not None and self._lock_.locked()
        if swapping or locked:
            return False
        res = self._res
        if self._writes or (res is not None and not self._store.release_now(res)):
            return False
        self.closed = True
        self._res = None
        self._give_back()
        return True

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            # Let a started swap finish (it holds the lock), so nothing is left reserved.
            await asyncio.shield(self._task)
        async with self._lock:
            if self.closed:
                return
            self.closed = True
            res, self._res = self._res, None
            if res is not None and self._writes:
                await self._store.settle(res, None, self._writes)
            elif res is not None:
                await self._store.release(res)
            self._give_back()
