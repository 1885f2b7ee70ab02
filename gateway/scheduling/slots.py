"""Slot pinning: one session keeps one slot of one replica (a session: the
client's key, else the conversation's implicit key), on engines that run a
fixed set of slots (`EngineAdapter.slot_field`, e.g. llama.cpp's `id_slot`).

Such an engine reuses a slot's prompt cache only when the request lands in
that slot. While the slot assigned to a session is free (no request of ours runs
in it, and `/slots` does not say it is processing), the request carries
the slot field; otherwise the engine chooses. A slot belongs to at most one
session per replica; a new session takes a free unowned slot, else the free
slot of the least recently served session. The client's own slot field is
never overridden.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

from gateway.scheduling.engine_view import engine_view
from gateway.scheduling.tracker import Tracker

if TYPE_CHECKING:
    from gateway.replicas.registry import Replica
    from gateway.request.context import RequestContext


class SlotPinner:
    def __init__(self, default_slots: int | None) -> None:
        self._default = default_slots
        self._owners: dict[str, OrderedDict[str, int]] = {}  # replica → session → slot, LRU first

    def apply(
        self, ctx: RequestContext, replica: Replica, tracker: Tracker, key: str | None
    ) -> int | None:
        """Pin (or unpin) the session `key` (the client's or the implicit one)
        to a slot of `replica` (`ctx.routing.pinned_slot`, which the forwarder
        writes into the upstream body); return the slot pinned."""
        assert ctx.request is not None
        body = ctx.request.body
        routing = ctx.routing
        routing.pinned_slot = routing.pinned_field = None  # an earlier attempt elsewhere
        slot_field = replica.engine.slot_field
        if slot_field is None or not key or slot_field in body:
            return None
        view = engine_view(replica)
        # the engine's slot list, else its slot count (`/props` total_slots), else config
        count = len(view.slots_busy) if view.slots_busy else (view.max_seqs or self._default)
        if not count:
            return None
        busy = {
            r.slot
            for r in tracker.outstanding(replica.name)
            if r.slot is not None and r.ctx is not ctx
        }
        busy |= {i for i, b in enumerate(view.slots_busy or ()) if b}
        slot = self._choose(replica.name, key, count, busy)
        if slot is not None:
            routing.pinned_slot, routing.pinned_field = slot, slot_field
        return slot

    def forget(self, replica: str) -> None:
        self._owners.pop(replica, None)

    def _choose(self, replica: str, key: str, count: int, busy: set[int]) -> int | None:
        owners = self._owners.setdefault(replica, OrderedDict())
        slot = owners.get(key)
        if slot is not None and slot < count:
            if slot in busy:
                return None
            owners.move_to_end(key)
            return slot
        owners.pop(key, None)
        owned = {s: k for k, s in owners.items()}
        free = [i for i in range(count) if i not in busy]
        unowned = [i for i in free if i not in owned]
        if unowned:
            slot = unowned[0]
        else:
            lru = [s for s in owners.values() if s in free]
            if not lru:
                return None
            slot = lru[0]
            del owners[owned[slot]]
        owners[key] = slot
        return slot
