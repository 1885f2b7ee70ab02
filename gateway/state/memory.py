"""In-process `StateStore`: the default with a single gateway instance.

Every operation runs without awaiting in between, so it is atomic on the
event loop. Expired reservations are rolled back lazily (on each call, a
bounded sweep), so memory stays bounded by live reservations and keys.

A counter is `base + held`: `base` is what settles and `put` left (it expires
with the key's TTL), `held` the amounts of live reservations plus settled
window amounts still inside their window (they leave on their own schedule,
never with the key's TTL). The Redis store keeps the same model (README.md).
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from fnmatch import fnmatchcase
from typing import ClassVar

from gateway.state.base import Claim, Reservation, ReserveResult, Stamp, TextRead, TextWrite

_SWEEP_BATCH = 256
# The expiry heap keeps an entry per reservation until its TTL (deadline +
# grace) passes, released or not; it is rebuilt from the live reservations
# once it holds this many more entries than twice their number, so memory
# follows live reservations, not the request rate × TTL.
_COMPACT_SLACK = 1024
# Keys and text values nobody touches again are dropped by a full scan once
# their number doubles since the last scan (amortised O(1) per write).
_SCAN_FLOOR = 1024
#: A settled window amount drops out at the end of its window rounded up to
#: the next 1/WINDOW_SLOTS of the window: at most this many entries per key,
#: whatever the request rate, and never early (the limit holds). Shared with
#: the Redis store so both behave alike.
WINDOW_SLOTS = 50


def window_drop(at: float, window_s: float) -> float:
    """When an amount reserved at `at` leaves a window of `window_s`."""
    slot = window_s / WINDOW_SLOTS
    return math.ceil((at + window_s) / slot) * slot


class _Window:
    """A key's settled window amounts, by the time they drop out."""

    __slots__ = ("amounts", "times")

    def __init__(self) -> None:
        self.times: list[float] = []  # a heap
        self.amounts: dict[float, int] = {}

    def add(self, drop: float, amount: int) -> None:
        if drop in self.amounts:
            self.amounts[drop] += amount
        else:
            self.amounts[drop] = amount
            heapq.heappush(self.times, drop)

    def prune(self, now: float) -> int:
        gone = 0
        times = self.times
        while times and times[0] <= now:
            gone += self.amounts.pop(heapq.heappop(times))
        return gone

    def retry_after(self, need: int, now: float) -> float | None:
        """Seconds until `need` has dropped out, or else until the first drop."""
        dropped = 0
        for drop, amount in sorted(self.amounts.items()):
            dropped += amount
            if dropped >= need:
                return drop - now
        return min(self.times) - now if self.times else None


class MemoryStateStore:
    #: Not shared with other gateway instances: callers may keep hot counters
    #: (the admission ledger) in their own memory instead (see `StateStore`).
    shared: ClassVar[bool] = False

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._base: dict[str, int] = {}
        self._key_expiry: dict[str, float] = {}
        self._held: dict[str, int] = {}
        self._windows: dict[str, _Window] = {}
        self._texts: dict[str, tuple[str, float]] = {}
        self._live: dict[str, tuple[Reservation, float]] = {}
        self._expiry_heap: list[tuple[float, str]] = []
        self._ids = itertools.count(1)
        self._scan_at = _SCAN_FLOOR

    async def reserve(
        self,
        claims: Sequence[Claim],
        ttl_s: float,
        stamps: Sequence[Stamp] = (),
        reads: Sequence[TextRead] = (),
    ) -> ReserveResult:
        now = self._clock()
        self._sweep(now)
        refused = self._refusal(claims, now)
        stored = tuple([self._stamp(s, now) for s in stamps]) if stamps else ()
        texts = tuple([self._read_text(r.key, r.refresh_ttl_s, now) for r in reads])
        if refused is not None:
            return refused._replace(stamps=stored, texts=texts)
        held = self._held
        for c in claims:
            held[c.key] = held.get(c.key, 0) + c.amount
            if c.key_ttl_s is not None:
                self._refresh(c.key, c.key_ttl_s, now)
        res = Reservation(f"m{next(self._ids)}", tuple(claims), now)
        expires = now + ttl_s
        self._live[res.id] = (res, expires)
        heapq.heappush(self._expiry_heap, (expires, res.id))
        return ReserveResult(res, stamps=stored, texts=texts)

    async def settle(
        self,
        reservation: Reservation,
        actual: Mapping[str, int] | None = None,
        writes: Sequence[TextWrite] = (),
    ) -> None:
        now = self._clock()
        self._sweep(now)
        self._finish(reservation.id, actual or {}, now)
        self._compact()
        for w in writes:
            self._write_text(w.key, w.value, w.key_ttl_s, now)

    async def release(self, reservation: Reservation) -> None:
        self.release_now(reservation)

    def release_now(self, reservation: Reservation) -> bool:
        now = self._clock()
        self._sweep(now)
        self._finish(reservation.id, {}, now)
        self._compact()
        return True

    async def renew(self, reservation: Reservation, ttl_s: float) -> bool:
        now = self._clock()
        self._sweep(now)
        live = self._live.get(reservation.id)
        if live is None or live[1] <= now:
            return False
        expires = now + ttl_s
        self._live[reservation.id] = (live[0], expires)
        heapq.heappush(self._expiry_heap, (expires, reservation.id))
        return True

    async def put(
        self, key: str, value: int, key_ttl_s: float | None = None, *, only_if_absent: bool = False
    ) -> int:
        now = self._clock()
        self._sweep(now)
        return self._stamp(Stamp(key, value, key_ttl_s, only_if_absent), now)

    async def get(self, keys: Sequence[str]) -> list[int]:
        now = self._clock()
        self._sweep(now)
        return [self._value(k, now) for k in keys]

    async def get_text(self, key: str, refresh_ttl_s: float | None = None) -> str | None:
        return self._read_text(key, refresh_ttl_s, self._clock())

    async def put_text(self, key: str, value: str, key_ttl_s: float) -> None:
        self._write_text(key, value, key_ttl_s, self._clock())

    def _read_text(self, key: str, refresh_ttl_s: float | None, now: float) -> str | None:
        entry = self._texts.get(key)
        if entry is None:
            return None
        if entry[1] <= now:
            del self._texts[key]
            return None
        if refresh_ttl_s is not None:
            self._texts[key] = (entry[0], now + refresh_ttl_s)
        return entry[0]

    def _write_text(self, key: str, value: str, key_ttl_s: float, now: float) -> None:
        self._texts[key] = (value, now + key_ttl_s)
        self._scan(now)

    async def count_keys(self, pattern: str) -> int:
        now = self._clock()
        self._sweep(now)
        counters = [k for k in [*self._base, *self._held] if fnmatchcase(k, pattern)]
        found = {k for k in counters if self._value(k, now)}
        found.update(k for k, v in self._texts.items() if v[1] > now and fnmatchcase(k, pattern))
        return len(found)

    async def ping(self) -> None:
        return None

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

    @property
    def tracked_keys(self) -> int:
        """Counter keys, TTLs and text values held (for memory-bound tests)."""
        return len(self._base) + len(self._key_expiry) + len(self._held) + len(self._texts)

    def _refusal(self, claims: Sequence[Claim], now: float) -> ReserveResult | None:
        for c in claims:
            if c.limit is not None and c.amount > 0:
                current = self._value(c.key, now)
                if current + c.amount > c.limit:
                    retry = None
                    window = self._windows.get(c.key)
                    if c.window_s is not None and window is not None and c.amount <= c.limit:
                        retry = window.retry_after(current + c.amount - c.limit, now)
                    return ReserveResult(None, c.key, current, c.limit, retry_after_s=retry)
        return None

    def _stamp(self, s: Stamp, now: float) -> int:
        key = s.key
        self._expire_base(key, now)
        if not (s.only_if_absent and key in self._base):
            self._base[key] = s.value
        if s.key_ttl_s is not None:
            self._key_expiry[key] = now + s.key_ttl_s
            self._scan(now)
        else:
            self._key_expiry.pop(key, None)
        return self._base[key]

    def _finish(self, res_id: str, actual: Mapping[str, int], now: float) -> None:
        live = self._live.pop(res_id, None)
        if live is None:
            return
        res, expires = live
        if expires <= now:
            actual = {}  # expired, not swept yet: roll back like the sweep would
        held = self._held
        for c in res.claims:
            key = c.key
            left = held.get(key, 0) - c.amount
            keep = actual.get(key, 0)
            if keep > 0 and c.window_s is None:
                self._expire_base(key, now)
                self._base[key] = self._base.get(key, 0) + keep
            elif keep > 0 and c.window_s is not None:
                drop = window_drop(res.at, c.window_s)
                if drop > now:
                    window = self._windows.get(key)
                    if window is None:
                        window = self._windows[key] = _Window()
                    else:  # keeps a key nobody reads within WINDOW_SLOTS entries
                        left -= window.prune(now)
                    window.add(drop, keep)
                    left += keep
            if left > 0:
                held[key] = left
            else:
                held.pop(key, None)
            if c.key_ttl_s is not None:
                self._refresh(key, c.key_ttl_s, now)

    def _refresh(self, key: str, ttl_s: float, now: float) -> None:
        self._expire_base(key, now)
        self._key_expiry[key] = now + ttl_s

    def _expire_base(self, key: str, now: float) -> None:
        expiry = self._key_expiry.get(key) if self._key_expiry else None
        if expiry is not None and expiry <= now:
            self._base.pop(key, None)
            del self._key_expiry[key]

    def _value(self, key: str, now: float) -> int:
        if self._key_expiry:
            self._expire_base(key, now)
        window = self._windows.get(key) if self._windows else None
        if window is not None:
            self._drop(key, window, now)
        return self._base.get(key, 0) + self._held.get(key, 0)

    def _drop(self, key: str, window: _Window, now: float) -> None:
        gone = window.prune(now)
        if gone:
            left = self._held.get(key, 0) - gone
            if left > 0:
                self._held[key] = left
            else:
                self._held.pop(key, None)
        if not window.times:
            del self._windows[key]

    def _scan(self, now: float) -> None:
        """Drop expired keys and text values nobody touched again (see _SCAN_FLOOR)."""
        if len(self._key_expiry) + len(self._texts) <= self._scan_at:
            return
        for key in [k for k, t in self._key_expiry.items() if t <= now]:
            self._expire_base(key, now)
        for key in [k for k, w in self._windows.items() if w.times[0] <= now]:
            self._drop(key, self._windows[key], now)
        self._texts = {k: v for k, v in self._texts.items() if v[1] > now}
        self._scan_at = max(_SCAN_FLOOR, 2 * (len(self._key_expiry) + len(self._texts)))

    def _compact(self) -> None:
        """Rebuild the expiry heap from the live reservations when most of its
        entries belong to reservations already released (see _COMPACT_SLACK)."""
        if len(self._expiry_heap) > 2 * len(self._live) + _COMPACT_SLACK:
            self._expiry_heap = [(expires, rid) for rid, (_res, expires) in self._live.items()]
            heapq.heapify(self._expiry_heap)

    def _sweep(self, now: float) -> None:
        heap = self._expiry_heap
        for _ in range(_SWEEP_BATCH):
            if not heap or heap[0][0] > now:
                return
            _expires, res_id = heapq.heappop(heap)
            live = self._live.get(res_id)
            if live is not None and live[1] <= now:
                self._finish(res_id, {}, now)
