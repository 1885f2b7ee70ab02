"""The token ledger: per-replica leases held through the `StateStore`.

Three counters per replica (`adm:<replica>:kv|prefill|inflight`). A lease is
one atomic `reserve` with a claim on each, so the check "does it still fit?"
and the update happen together — in-process now, in one Lua script with
Redis later, so several gateways sharing a store never oversubscribe.

When the first response byte arrives the prefill work is done: the lease
swaps its reservation for one without the prefill claim (reserve the rest
unconditionally, then release the old one: the backlog is briefly
over-counted, never under-counted). `close` releases whatever is held; it
is idempotent and runs in `finally` on every path.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import NamedTuple

from gateway.replicas import Replica
from gateway.state import Claim, Reservation, StateStore


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
    base = f"adm:{replica}:"
    return base + "kv", base + "prefill", base + "inflight"


def claims(replica: str, demand: Demand, limits: Limits) -> list[Claim]:
    kv, prefill, inflight = keys(replica)
    out = [Claim(kv, demand.kv_tokens, limits.kv), Claim(inflight, 1, limits.in_flight)]
    if demand.prefill_tokens > 0:
        out.append(Claim(prefill, demand.prefill_tokens, limits.prefill))
    return out


Delta = Callable[["Lease", int, int, int], None]  # (lease, Δkv, Δprefill, Δin-flight)


class Lease:
    """A held reservation on `replica`; `.replica` is what the pipeline forwards to.

    `res` is None for a pass-through lease (admission disabled): nothing is
    reserved, but in-flight counts are still reported through `on_change`.
    """

    def __init__(self, replica: Replica, demand: Demand, store: StateStore, res: Reservation | None,
                 ttl_s: float, on_change: Delta) -> None:
        self.replica = replica
        self.demand = demand
        self._store = store
        self._res = res
        self._ttl_s = ttl_s
        self._on_change = on_change
        self._lock_: asyncio.Lock | None = None  # only a prefill swap needs one
        self._task: asyncio.Task[None] | None = None
        self.prefill_held = demand.prefill_tokens if res is not None else 0
        self.kv_held = demand.kv_tokens if res is not None else 0
        self.closed = False
        on_change(self, self.kv_held, self.prefill_held, 1)

    @property
    def _lock(self) -> asyncio.Lock:
        if self._lock_ is None:
            self._lock_ = asyncio.Lock()
        return self._lock_

    def first_byte(self) -> None:
        """Sync hook run when the first response byte arrives: the prefill is done."""
        if self.prefill_held and self._task is None and not self.closed:
            self._task = asyncio.get_running_loop().create_task(self._end_prefill())

    async def _end_prefill(self) -> None:
        async with self._lock:
            if self.closed or self._res is None:
                return
            rest = [Claim(c.key, c.amount) for c in self._res.claims if not c.key.endswith(":prefill")]
            new = await self._store.reserve(rest, self._ttl_s)
            old, self._res = self._res, new.reservation
            await self._store.release(old)
            held, self.prefill_held = self.prefill_held, 0
            self._on_change(self, 0, -held, 0)

    def close_now(self) -> bool:
        """Release at once when nothing can interleave (no prefill swap under way,
        an in-process store); False: use `close`."""
        if self.closed:
            return True
        swapping = self._task is not None and not self._task.done()
        locked = self._lock_ is not None and self._lock_.locked()
        release_now = getattr(self._store, "release_now", None)  # `LocalRelease`
        if swapping or locked or release_now is None:
            return False
        self.closed = True
        res, self._res = self._res, None
        if res is not None:
            release_now(res)
        kv, prefill = self.kv_held, self.prefill_held
        self.kv_held = self.prefill_held = 0
        self._on_change(self, -kv, -prefill, -1)
        return True

    async def close(self) -> None:
        """Release everything held; idempotent."""
        if self._task is not None and not self._task.done():
            # Let a started swap finish (it holds the lock), so nothing is left reserved.
            await asyncio.shield(self._task)
        async with self._lock:
            if self.closed:
                return
            self.closed = True
            res, self._res = self._res, None
            if res is not None:
                await self._store.release(res)
            kv, prefill = self.kv_held, self.prefill_held
            self.kv_held = self.prefill_held = 0
            self._on_change(self, -kv, -prefill, -1)
