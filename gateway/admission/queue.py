"""The gateway's admission queue: priority class, then deadline, then arrival.

Bounded per class in requests and in tokens. Entries are removed when
admitted, shed, or cancelled (client gone): `remove` is O(log n) amortised
(lazy deletion in a heap, compacted when dead entries dominate). The queue
also measures its drain rate per class (admissions out of the queue per
second, EWMA) to compute `Retry-After` for rejected requests.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

_EWMA = 0.2


@dataclass(eq=False, slots=True)
class Entry(Generic[T]):
    item: T
    cls: str
    deadline: float
    tokens: int
    enqueued_at: float
    seq: int = 0
    live: bool = True

    def key(self, rank: int) -> tuple[int, float, int]:
        return rank, self.deadline, self.seq


@dataclass(slots=True)
class ClassStats:
    length: int = 0
    tokens: int = 0
    drain_per_s: float | None = None
    last_drain: float | None = None


class QueueFull(Exception):
    def __init__(self, cls: str, what: str, retry_after: float) -> None:
        super().__init__(f"the {cls} queue is full ({what})")
        self.cls = cls
        self.what = what
        self.retry_after = retry_after


class AdmissionQueue(Generic[T]):
    def __init__(
        self,
        classes: tuple[str, ...],
        max_requests: dict[str, int],
        max_tokens: dict[str, int],
        clock: Callable[[], float],
    ) -> None:
        self._rank = {c: i for i, c in enumerate(classes)}
        self._max_requests = max_requests
        self._max_tokens = max_tokens
        self._clock = clock
        self._heap: list[tuple[tuple[int, float, int], Entry[T]]] = []
        self._seq = itertools.count()
        self.stats: dict[str, ClassStats] = {c: ClassStats() for c in classes}
        self._dead = 0
        self._length = 0  # live entries, all classes (asked on every admission)

    def __len__(self) -> int:
        return self._length

    def rank(self, cls: str) -> int:
        return self._rank.get(cls, len(self._rank))

    def push(self, item: T, cls: str, deadline: float, tokens: int) -> Entry[T]:
        st = self.stats[cls]
        if st.length + 1 > self._max_requests[cls]:
            raise QueueFull(cls, f"{st.length} requests", self.retry_after(cls))
        if st.tokens + tokens > self._max_tokens[cls]:
            raise QueueFull(cls, f"{st.tokens} tokens", self.retry_after(cls))
        entry = Entry(item, cls, deadline, tokens, self._clock(), next(self._seq))
        heapq.heappush(self._heap, (entry.key(self.rank(cls)), entry))
        st.length += 1
        st.tokens += tokens
        self._length += 1
        return entry

    def remove(self, entry: Entry[T], admitted: bool = False) -> bool:
        """Take `entry` out (admitted: counts towards the drain rate); False if already out."""
        if not entry.live:
            return False
        entry.live = False
        st = self.stats[entry.cls]
        st.length -= 1
        st.tokens -= entry.tokens
        self._length -= 1
        self._dead += 1
        if admitted:
            self._drained(st)
        if self._dead > 64 and self._dead > len(self._heap) // 2:
            self._heap = [x for x in self._heap if x[1].live]
            heapq.heapify(self._heap)
            self._dead = 0
        return True

    def ordered(self) -> Iterator[Entry[T]]:
        """Live entries, best first (a snapshot: safe to remove while iterating)."""
        return iter([e for _, e in sorted(self._heap, key=lambda x: x[0]) if e.live])

    def ahead_tokens(self, entry: Entry[T]) -> int:
        """Tokens queued ahead of `entry` (better or equal key)."""
        key = entry.key(self.rank(entry.cls))
        return sum(e.tokens for k, e in self._heap if e.live and k < key)

    def retry_after(self, cls: str) -> float:
        """Seconds until this class's queue has drained, from the observed rate (1–60 s)."""
        st = self.stats[cls]
        if not st.drain_per_s:
            return 5.0
        return float(min(60.0, max(1.0, math.ceil(st.length / st.drain_per_s))))

    def _drained(self, st: ClassStats) -> None:
        now = self._clock()
        if st.last_drain is not None and now > st.last_drain:
            sample = 1.0 / (now - st.last_drain)
            st.drain_per_s = (
                sample if st.drain_per_s is None else (1 - _EWMA) * st.drain_per_s + _EWMA * sample
            )
        st.last_drain = now
