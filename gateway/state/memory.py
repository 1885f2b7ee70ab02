"""In-process `StateStore`: the default with a single gateway instance.

Every operation runs without awaiting in between, so it is atomic on the
event loop. Expired reservations are rolled back lazily (on each call, a
bounded sweep), so memory stays bounded by live reservations and keys.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar

from gateway.state.base import Claim, Reservation, ReserveResult

_SWEEP_BATCH = 256
# The expiry heap keeps an entry per reservation until its TTL (deadline +
# grace) passes, released or not; it is rebuilt from the live reservations
# once it holds this many more entries than twice their number, so memory
# follows live reservations, not the request rate × TTL.
_COMPACT_SLACK = 1024


class MemoryStateStore:
    #: Not shared with other gateway instances: callers may keep hot counters
    #: (the admission ledger) in their own memory instead (see `StateStore`).
    shared: ClassVar[bool] = False

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._values: dict[str, int] = {}
        self._key_expiry: dict[str, float] = {}
        self._live: dict[str, tuple[Reservation, float]] = {}
        self._expiry_heap: list[tuple[float, str]] = []
        self._ids = itertools.count(1)

    async def reserve(self, claims: Sequence[Claim], ttl_s: float) -> ReserveResult:
        now = self._clock()
        self._sweep(now)
        if self._key_expiry:
            for c in claims:
                self._value(c.key, now)  # drops the key if it expired
        values = self._values
        for c in claims:
            if c.limit is not None and c.amount > 0:
                current = values.get(c.key, 0)
                if current + c.amount > c.limit:
                    return ReserveResult(None, c.key, current, c.limit)
        for c in claims:
            self._add(c.key, c.amount, c.key_ttl_s, now)
        res = Reservation(f"m{next(self._ids)}", tuple(claims))
        expires = now + ttl_s
        self._live[res.id] = (res, expires)
        heapq.heappush(self._expiry_heap, (expires, res.id))
        return ReserveResult(res)

    async def settle(
        self, reservation: Reservation, actual: Mapping[str, int] | None = None
    ) -> None:
        now = self._clock()
        self._sweep(now)
        self._finish(reservation.id, actual or {}, now)
        self._compact()

    async def release(self, reservation: Reservation) -> None:
        self.release_now(reservation)

    def release_now(self, reservation: Reservation) -> None:
        now = self._clock()
        self._sweep(now)
        self._finish(reservation.id, {}, now)
        self._compact()

    async def renew(self, reservation: Reservation, ttl_s: float) -> bool:
        self._sweep()
        live = self._live.get(reservation.id)
        if live is None:
            return False
        expires = self._clock() + ttl_s
        self._live[reservation.id] = (live[0], expires)
        heapq.heappush(self._expiry_heap, (expires, reservation.id))
        return True

    async def put(
        self, key: str, value: int, key_ttl_s: float | None = None, *, only_if_absent: bool = False
    ) -> int:
        self._sweep()
        self._value(key)  # drops the key if it expired
        if not (only_if_absent and key in self._values):
            self._values[key] = value
        if key_ttl_s is not None:
            self._key_expiry[key] = self._clock() + key_ttl_s
        else:
            self._key_expiry.pop(key, None)
        return self._values[key]

    async def get(self, keys: Sequence[str]) -> list[int]:
        self._sweep()
        return [self._value(k) for k in keys]

    async def close(self) -> None:
        return None

    @property
    def live_reservations(self) -> int:
        return len(self._live)

    @property
    def pending_expiries(self) -> int:
        """Entries in the expiry heap (live reservations, renewals, and released
        ones not yet compacted away): bounded by 2 × live + a constant."""
        return len(self._expiry_heap)

    def _finish(self, res_id: str, actual: Mapping[str, int], now: float | None = None) -> None:
        live = self._live.pop(res_id, None)
        if live is None:
            return
        if now is None:
            now = self._clock()
        for c in live[0].claims:
            keep = actual.get(c.key, 0)
            # Never below 0: the claim's own amount may have expired with its key.
            self._add(c.key, keep - c.amount, c.key_ttl_s, now, floor=True)

    def _compact(self) -> None:
        """Rebuild the expiry heap from the live reservations when most of its
        entries belong to reservations already released (see _COMPACT_SLACK)."""
        if len(self._expiry_heap) > 2 * len(self._live) + _COMPACT_SLACK:
            self._expiry_heap = [(expires, rid) for rid, (_res, expires) in self._live.items()]
            heapq.heapify(self._expiry_heap)

    def _value(self, key: str, now: float | None = None) -> int:
        expiry = self._key_expiry.get(key) if self._key_expiry else None
        if expiry is not None and expiry <= (self._clock() if now is None else now):
            self._values.pop(key, None)
            self._key_expiry.pop(key, None)
        return self._values.get(key, 0)

    def _add(
        self, key: str, delta: int, ttl: float | None, now: float, floor: bool = False
    ) -> None:
        value = (self._value(key, now) if self._key_expiry else self._values.get(key, 0)) + delta
        if floor and value < 0:
            value = 0
        if value == 0 and ttl is None:
            self._values.pop(key, None)
        else:
            self._values[key] = value
        if ttl is not None:
            self._key_expiry[key] = now + ttl

    def _sweep(self, now: float | None = None) -> None:
        if now is None:
            now = self._clock()
        heap = self._expiry_heap
        for _ in range(_SWEEP_BATCH):
            if not heap or heap[0][0] > now:
                return
            _expires, res_id = heapq.heappop(heap)
            live = self._live.get(res_id)
            if live is not None and live[1] <= now:
                self._finish(res_id, {}, now)
