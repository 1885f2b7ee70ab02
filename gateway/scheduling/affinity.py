"""Session → replica affinity shared by several gateway instances.

With a shared state store, the replica a session was routed to is kept in
the store (`aff:{<hash of the session key>}`, expiring after the router's
`index_ttl_s` without use), so its next turn lands on the same replica
whichever instance receives it. The key is the one routing follows: the
client's, else a chat's implicit one (`gateway.scheduling.conversation`), so
a conversation without a session header stays together across instances
too. One read per request that has a key (it also restarts the TTL), one
write only when the session moves. Both ride on the request's budget
reservation when it has one (`Rider`: the read in its reserve, the write in
its settle), so they cost no round trip of their own.

Best effort: when the store cannot answer, routing falls back to the
instance's own memory of the session (the in-process tracker).
"""

from __future__ import annotations

import logging

import xxhash

from gateway.errors import StateUnavailable
from gateway.request.context import RequestContext
from gateway.state.base import Rider, StateStore, StoreUnavailable, TextRead, TextWrite

log = logging.getLogger(__name__)


class SessionAffinity:
    def __init__(self, store: StateStore, ttl_s: float) -> None:
        self._store = store
        self._ttl_s = ttl_s

    @staticmethod
    def _key(session_key: str) -> str:
        return "aff:{" + xxhash.xxh3_128_hexdigest(session_key.encode()) + "}"

    def rider(self, key: str | None) -> Rider | None:
        """The read (and later write) of `key`'s replica, to ride on the
        request's budget reservation; None without a key."""
        if not key:
            return None
        return Rider((TextRead(self._key(key), self._ttl_s),))

    async def lookup(
        self, ctx: RequestContext, key: str | None, rider: Rider | None = None
    ) -> None:
        """Set `ctx.routing.session_replica` from the shared store (`key`: the
        session key routing follows, the client's or an implicit one); from
        what `rider` read when a reservation carried it."""
        if not key:
            return
        if rider is not None and rider.texts:
            ctx.routing.session_replica = rider.texts[0]
            return
        try:
            found = await self._store.get_text(self._key(key), refresh_ttl_s=self._ttl_s)
        except (StateUnavailable, StoreUnavailable):
            log.debug("session affinity lookup skipped: state store unavailable")
            return
        ctx.routing.session_replica = found

    async def count(self) -> int:
        """Sessions the shared map holds (a full scan: admin API only)."""
        return await self._store.count_keys("aff:*")

    async def replica_of(self, session_key: str) -> str | None:
        """The session's replica, without restarting its TTL (admin API)."""
        return await self._store.get_text(self._key(session_key))

    async def remember(
        self, ctx: RequestContext, key: str | None, replica: str, rider: Rider | None = None
    ) -> None:
        """Record where the session went, when that is news (written when
        the request's reservation settles, if `rider` has one)."""
        if not key or ctx.routing.session_replica == replica:
            return
        if rider is not None and rider.carried:
            rider.writes.append(TextWrite(self._key(key), replica, self._ttl_s))
            ctx.routing.session_replica = replica
            return
        try:
            await self._store.put_text(self._key(key), replica, self._ttl_s)
        except (StateUnavailable, StoreUnavailable):
            log.debug("session affinity not recorded: state store unavailable")
            return
        ctx.routing.session_replica = replica
