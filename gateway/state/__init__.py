"""Shared state (budgets, rate counters, replica ledgers) behind one protocol.

`StateStore` offers one atomic primitive, all-or-nothing `reserve` over
several counters with limits, plus `settle` (commit the actual amounts,
release the rest) and `release`. Budgets, rate limits, concurrency limits
and the admission ledger are all built on it. One implementation exists
today: the in-process `MemoryStateStore`; a store shared by several gateway
instances (Redis, one Lua script per operation) would implement the same
protocol.
"""

from __future__ import annotations

from gateway.state.base import Claim, Reservation, ReserveResult, StateStore
from gateway.state.memory import MemoryStateStore

__all__ = ["Claim", "MemoryStateStore", "Reservation", "ReserveResult", "StateStore"]
