"""The router's own bookkeeping: requests it routed that are still running,
and the replica each session went to last.

A routed request stays outstanding on its replica until the pipeline
settles it (`ctx.finished_at`) or retries it elsewhere (`ctx.replica`
changes); it counts as queued prefill work until its first byte was sent,
then as a running decode attending to its prompt's tokens.
Entries are pruned lazily whenever a replica's list is read, so the lists
are bounded by the requests in flight. This view complements the engine's
(`state.engine_view`), which may lag or be absent.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.request.context import RequestContext


@dataclass(slots=True, eq=False)
class Routed:
    ctx: RequestContext  # quoted: see gateway/request/context.py
    replica: str
    kv_tokens: int
    uncached_tokens: int
    slot: int | None = None
    #: the prompt's tokens: the KV its decode steps attend to
    prompt_tokens: int = 0

    @property
    def active(self) -> bool:
        r = self.ctx.replica
        return self.ctx.finished_at is None and r is not None and r.name == self.replica


_PRUNE_MIN = 64


class Tracker:
    def __init__(self, clock: Callable[[], float], session_ttl_s: float, max_sessions: int) -> None:
        self._clock = clock
        self._ttl = session_ttl_s
        self._max_sessions = max_sessions
        self._routed: dict[str, list[Routed]] = {}
        self._prune_at: dict[str, int] = {}
        self._sessions: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._session_counts: Counter[str] = Counter()

    def add(self, routed: Routed) -> None:
        """Record a routed request; finished ones are dropped here too (amortised:
        whenever the list doubles), not only when routing reads the list."""
        name = routed.replica
        items = self._routed.setdefault(name, [])
        items.append(routed)
        if len(items) >= self._prune_at.get(name, _PRUNE_MIN):
            live = [r for r in items if r.active]
            self._routed[name] = live
            self._prune_at[name] = max(_PRUNE_MIN, 2 * len(live))

    def outstanding(self, replica: str) -> list[Routed]:
        items = self._routed.get(replica)
        if not items:
            return []
        live = [r for r in items if r.active]
        if len(live) != len(items):
            self._routed[replica] = live
        return live

    def kv_tokens(self, replica: str) -> int:
        return sum(r.kv_tokens for r in self.outstanding(replica))

    def loads(self, replica: str) -> tuple[int, int, int, int]:
        """One pass over the replica's outstanding requests: (prefilling, queued
        prefill tokens, decoding, prompt tokens the decoding ones attend to)."""
        prefilling = backlog = decoding = attended = 0
        for r in self.outstanding(replica):
            if r.ctx.first_byte_at is None:
                prefilling += 1
                backlog += r.uncached_tokens
            else:
                decoding += 1
                attended += r.prompt_tokens
        return prefilling, backlog, decoding, attended

    def session_replica(self, key: str) -> str | None:
        entry = self._sessions.get(key)
        if entry is None:
            return None
        if entry[1] <= self._clock():
            self._forget(key)
            return None
        return entry[0]

    def forget_replica(self, replica: str) -> None:
        """A replica that left the set: its outstanding list goes (its sessions
        expire as usual; routing skips a remembered replica that is gone)."""
        self._routed.pop(replica, None)
        self._prune_at.pop(replica, None)

    def session_count(self) -> int:
        """Sessions remembered (expired ones not yet pruned included)."""
        return len(self._sessions)

    def session_counts(self) -> Counter[str]:
        """Live sessions per replica (bounded-load placement of new sessions)."""
        return self._session_counts

    def remember_session(self, key: str, replica: str) -> None:
        now = self._clock()
        if key in self._sessions:
            self._forget(key)
        self._sessions[key] = (replica, now + self._ttl)
        self._session_counts[replica] += 1
        while len(self._sessions) > self._max_sessions:
            self._forget(next(iter(self._sessions)))
        while self._sessions:
            oldest = next(iter(self._sessions))
            if self._sessions[oldest][1] > now:
                break
            self._forget(oldest)

    def _forget(self, key: str) -> None:
        replica, _ = self._sessions.pop(key)
        self._session_counts[replica] -= 1
        if self._session_counts[replica] <= 0:
            del self._session_counts[replica]
