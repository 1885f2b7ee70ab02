"""Shared state (budgets, rate counters, replica ledgers) behind one protocol.

`StateStore` offers one atomic primitive, all-or-nothing `reserve` over
several counters with limits, plus `settle` (commit the actual amounts,
release the rest) and `release`. Budgets, rate limits, concurrency limits
and the admission ledger are all built on it, so the in-process store and
the Redis store (one Lua script per operation) behave identically.
"""

from __future__ import annotations

from gateway.state.base import Claim, Reservation, ReserveResult, StateStore
from gateway.state.memory import MemoryStateStore

__all__ = ["Claim", "MemoryStateStore", "Reservation", "ReserveResult", "StateStore"]
