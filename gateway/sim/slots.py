"""llama.cpp-style slots: `parallel` slots, each with its own prompt cache.

Each slot holds `kv_tokens // parallel` tokens (`n_ctx`), or the whole
context with `unified_kv`. A task goes to the slot named by `id_slot` when
that slot is idle; otherwise to the idle slot whose cached tokens share the
longest prefix with the prompt, if that overlap exceeds
`slot_prompt_similarity` of the prompt; otherwise to the least recently used
idle slot. With no usable idle slot the task waits in an unbounded deferred
queue (`llamacpp:requests_deferred`), retried in order whenever a step starts.

At pickup the slot keeps the common prefix of its cache and the prompt
(`cache_prompt`, default true; at least one prompt token is always
evaluated), so `cached_tokens` = that prefix. A prompt of `n_ctx` tokens or
more fails then, not before: `exceed_context_size_error`. Generation stops
at the end of the slot's context. A finished or cancelled task leaves its
tokens in the slot as its cache.

Each step is one llama_decode(): one token for every generating slot, then
prompt tokens of slots still reading their prompt, up to `n_batch` in total.

Approximations: with `unified_kv` the shared pool evicts idle slots' caches
(least recently used first) when it runs short, a task is picked up only if
its uncached prompt fits, and a generating task that finds no free cell ends
with "length" (the real server fails the decode). No context shift, no
speculative decoding, no multimodal prompts.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from gateway.sim.config import SimConfig
from gateway.sim.engine import EngineCore, Work
from gateway.sim.request import SimRequest, State


@dataclass(slots=True, eq=False)
class Slot:
    id: int
    n_ctx: int
    cache: list[int] = field(default_factory=list)
    req: SimRequest | None = None
    last_used: int = 0
    id_task: int | None = None
    last_prompt_tokens: int = 0
    last_cached: int = 0
    last_decoded: int = 0
    last_n_predict: int = -1


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class SlotScheduler:
    """The llama.cpp flavour's scheduler (see the module docstring)."""

    def __init__(self, config: SimConfig, core: EngineCore) -> None:
        self.config = config
        self.core = core
        self.slots = [Slot(i, config.slot_ctx) for i in range(config.parallel)]
        self.deferred: deque[SimRequest] = deque()
        #: Arrivals since the last step: flagged `deferred` if no slot took them.
        self._fresh: list[SimRequest] = []
        self._tick = itertools.count(1)
        self._task_ids = itertools.count()
        #: Longest context a slot reached (`llamacpp:n_tokens_max`).
        self.n_tokens_max = 0

    # --- Scheduler protocol ----------------------------------------------------
    def add(self, req: SimRequest) -> None:
        self.deferred.append(req)
        self._fresh.append(req)

    def remove(self, req: SimRequest) -> None:
        if req.state is State.RUNNING and req.slot is not None:
            self._release(self.slots[req.slot])
        elif req in self.deferred:
            self.deferred.remove(req)

    def schedule(self) -> list[Work]:
        self._assign_deferred()
        budget = self.config.n_batch
        plan: list[Work] = []
        busy = [s.req for s in self.slots if s.req is not None]
        for req in busy:
            if req.record.first_token is not None and self._reserve(req, 1):
                plan.append(Work(req, 1, decode=True))
                budget -= 1
        for req in busy:
            left = len(req.prompt) - req.num_computed
            if req.record.first_token is None and left > 0 and budget > 0:
                n = min(left, budget)
                if self._reserve(req, n):
                    plan.append(Work(req, n, decode=False))
                    budget -= n
        return plan

    def commit(self, plan: list[Work], now: float) -> None:
        for work in plan:
            req = work.req
            if req.state is not State.RUNNING or req.slot is None:
                continue
            slot = self.slots[req.slot]
            slot.cache.extend(req.token_range(req.num_computed, req.num_computed + work.n))
            self.n_tokens_max = max(self.n_tokens_max, len(slot.cache))
            req.num_computed += work.n
            if req.num_computed == req.num_tokens:
                reason = self.core.sample(req, now)
                if reason is not None:
                    self._release(slot)
                    self.core.finish(req, reason, now)

    def gauges(self) -> dict[str, Any]:
        bs = self.config.block_size
        busy = [s for s in self.slots if s.req is not None]
        pinned = sum(-(-len(s.cache) // bs) for s in busy)
        total = self.config.kv_tokens // bs
        return {
            "running": len(busy),
            "waiting": len(self.deferred),
            "deferred": len(self.deferred),
            "kv_blocks_pinned": pinned,
            "kv_blocks_total": total,
            "kv_tokens_used": sum(len(s.cache) for s in self.slots),
            "kv_usage": pinned / total,
            "n_tokens_max": self.n_tokens_max,
        }

    def clear_cache(self) -> None:
        for slot in self.slots:
            if slot.req is None:
                slot.cache = []

    # --- slot choice -------------------------------------------------------------
    def _assign_deferred(self) -> None:
        """Give idle slots to queued tasks, in order; stops when no slot is idle."""
        idle = sum(1 for s in self.slots if s.req is None)
        i = 0
        while idle and i < len(self.deferred):
            req = self.deferred[i]
            slot = self._pick(req)
            if slot is None:
                i += 1  # pinned to a busy slot
                continue
            del self.deferred[i]
            if len(req.prompt) >= slot.n_ctx:
                self._fail_context(req, slot)
            elif self._start(req, slot):
                idle -= 1
            else:
                self.deferred.insert(i, req)
                break  # unified pool full: keep the queue order
        for req in self._fresh:
            if req.state is State.WAITING:
                self._note_deferred(req)
        self._fresh.clear()

    def _note_deferred(self, req: SimRequest) -> None:
        if not req.record.deferred:
            req.record.deferred = True
            self.core.totals.deferrals += 1

    def _pick(self, req: SimRequest) -> Slot | None:
        if req.id_slot is not None and req.id_slot >= 0:
            slot = self.slots[req.id_slot]
            return slot if slot.req is None else None
        idle = [s for s in self.slots if s.req is None]
        if not idle:
            return None
        best, best_lcp = None, 0
        for slot in idle:
            lcp = common_prefix(slot.cache, req.prompt)
            if lcp > best_lcp:
                best, best_lcp = slot, lcp
        threshold = self.config.slot_prompt_similarity
        if best is not None and best_lcp / max(len(req.prompt), 1) > threshold:
            return best
        return min(idle, key=lambda s: s.last_used)

    def _start(self, req: SimRequest, slot: Slot) -> bool:
        n_past = common_prefix(slot.cache, req.prompt) if req.cache_prompt else 0
        n_past = min(n_past, len(req.prompt) - 1)
        if self.config.unified_kv and not self._make_room(len(req.prompt) - n_past + 1, slot):
            return False
        del slot.cache[n_past:]
        slot.req, slot.id_task = req, next(self._task_ids)
        slot.last_prompt_tokens, slot.last_decoded = len(req.prompt), 0
        slot.last_cached = n_past
        slot.last_n_predict = req.max_output
        req.slot, req.state, req.num_computed = slot.id, State.RUNNING, n_past
        rec = req.record
        rec.slot, rec.cached_tokens, rec.scheduled = slot.id, n_past, self.core.clock.now()
        self.core.totals.prefix_queries_tokens += len(req.prompt)
        self.core.totals.prefix_hits_tokens += n_past
        return True

    def _fail_context(self, req: SimRequest, slot: Slot) -> None:
        n_prompt, n_ctx = len(req.prompt), slot.n_ctx
        error = {
            "code": 400,
            "message": (
                f"request ({n_prompt} tokens) exceeds the available context size "
                f"({n_ctx} tokens), try increasing it"
            ),
            "type": "exceed_context_size_error",
            "n_prompt_tokens": n_prompt,
            "n_ctx": n_ctx,
        }
        self.core.fail(req, 400, error, self.core.clock.now())

    def _release(self, slot: Slot) -> None:
        if slot.req is not None:
            slot.last_decoded = len(slot.req.output_ids)
            slot.req.slot = None
        slot.req = None
        slot.last_used = next(self._tick)

    # --- unified KV pool ---------------------------------------------------------
    def _reserve(self, req: SimRequest, cells: int) -> bool:
        """Unified pool only: find `cells` free cells, or end a generating task."""
        if not self.config.unified_kv or req.slot is None:
            return True
        if self._make_room(cells, self.slots[req.slot]):
            return True
        if req.record.first_token is not None:
            self._release(self.slots[req.slot])
            self.core.finish(req, "length", self.core.clock.now())
        return False

    def _make_room(self, cells: int, keep: Slot) -> bool:
        free = self.config.kv_tokens - sum(len(s.cache) for s in self.slots)
        idle = sorted(
            (s for s in self.slots if s.req is None and s is not keep and s.cache),
            key=lambda s: s.last_used,
        )
        for slot in idle:
            if free >= cells:
                break
            free += len(slot.cache)
            slot.cache = []
        return free >= cells
