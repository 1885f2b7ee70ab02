"""Shared state (budgets, rate counters, replica ledgers) behind one protocol.

`StateStore` offers one atomic primitive, all-or-nothing `reserve` over
several counters with limits (plain or sliding-window), plus `settle`
(commit the actual amounts, release the rest) and `release`. Budgets, rate
limits, concurrency limits and the admission ledger are all built on it.
Two implementations: the in-process `MemoryStateStore` (the default) and
`RedisStateStore` (`gateway.state.redis`, one Lua script per operation),
shared by several gateway instances. The Redis module is imported on demand
so the in-process default never loads the Redis client.
"""

from __future__ import annotations

from gateway.state.base import (
    Claim,
    Reservation,
    ReserveResult,
    Rider,
    Stamp,
    StateStore,
    StoreUnavailable,
    TextRead,
    TextWrite,
)
from gateway.state.memory import MemoryStateStore

__all__ = [
    "Claim",
    "MemoryStateStore",
    "Reservation",
    "ReserveResult",
    "Rider",
    "Stamp",
    "StateStore",
    "StoreUnavailable",
    "TextRead",
    "TextWrite",
]
