"""Shared state (reservations, counters, leases) behind one `StateStore` protocol.

In-process by default; Redis when `state.backend: redis` (its own module).
"""

from __future__ import annotations
