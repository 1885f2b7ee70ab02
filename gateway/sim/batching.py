"""vLLM-style continuous batching over the paged KV pool.

Each step (as vLLM's V1 scheduler): running requests first, in order, each
taking one decode token or its next prefill chunk (chunked prefill) within
`max_num_batched_tokens`; then, if nothing was preempted in this step, waiting
requests join while fewer than `max_num_seqs` run. A joining request looks up
its longest cached prefix (at most `num_tokens - 1` tokens: at least one token
is always computed) and pins those blocks.

When blocks run out for a running request, the newest running request (FCFS)
or the lowest-priority one (largest `priority`, then latest arrival) is
preempted: its blocks are released (their cached hashes stay until evicted)
and it goes back to the head of the queue, to be recomputed from scratch,
prompt and tokens generated so far, possibly hitting its own cached blocks.

Approximations: no speculative decoding, no async scheduling, one engine
(data-parallel rank 0), and the waiting queue blocks at its head when the head
does not fit (as vLLM does).
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from typing import Any

from gateway.sim.config import SimConfig
from gateway.sim.engine import EngineCore, Work
from gateway.sim.kv import BlockPool, extend_hashes, salt_root
from gateway.sim.kvevents import KVEventPublisher
from gateway.sim.request import SimRequest, State


class WaitQueue:
    """FCFS deque, or a heap on (priority, arrival) under the priority policy."""

    def __init__(self, priority: bool) -> None:
        self._priority = priority
        self._fifo: deque[SimRequest] = deque()
        self._heap: list[tuple[int, float, int, SimRequest]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._heap) if self._priority else len(self._fifo)

    def push(self, req: SimRequest, front: bool = False) -> None:
        if self._priority:
            key = (req.priority, req.record.arrival, next(self._seq), req)
            heapq.heappush(self._heap, key)
        elif front:
            self._fifo.appendleft(req)
        else:
            self._fifo.append(req)

    def peek(self) -> SimRequest:
        return self._heap[0][3] if self._priority else self._fifo[0]

    def pop(self) -> SimRequest:
        return heapq.heappop(self._heap)[3] if self._priority else self._fifo.popleft()

    def remove(self, req: SimRequest) -> None:
        if self._priority:
            self._heap = [item for item in self._heap if item[3] is not req]
            heapq.heapify(self._heap)
        elif req in self._fifo:
            self._fifo.remove(req)


class BatchScheduler:
    """The vLLM flavour's scheduler (see the module docstring)."""

    def __init__(self, config: SimConfig, core: EngineCore) -> None:
        self.config = config
        self.core = core
        self.pool = BlockPool(config.num_gpu_blocks, config.enable_prefix_caching)
        self.waiting = WaitQueue(config.scheduling_policy == "priority")
        self.running: list[SimRequest] = []
        self._bs = config.block_size
        #: Set while the replica publishes KV events (`SimConfig.kv_events_endpoint`).
        self.publisher: KVEventPublisher | None = None

    # --- Scheduler protocol ----------------------------------------------------
    def add(self, req: SimRequest) -> None:
        self._extend_hashes(req, len(req.prompt) // self._bs)
        self.waiting.push(req)

    def remove(self, req: SimRequest) -> None:
        if req.state is State.RUNNING:
            self.running.remove(req)
            self._release(req)
        else:
            self.waiting.remove(req)

    def schedule(self) -> list[Work]:
        budget = self.config.max_num_batched_tokens
        planned: dict[SimRequest, Work] = {}
        budget, preempted = self._schedule_running(planned, budget)
        if not preempted:
            self._schedule_waiting(planned, budget)
        return list(planned.values())

    def commit(self, plan: list[Work], now: float) -> None:
        for work in plan:
            req = work.req
            if req.state is not State.RUNNING:
                continue  # aborted while the step ran
            req.num_computed += work.n
            self._cache_full_blocks(req)
            if req.num_computed == req.num_tokens:
                reason = self.core.sample(req, now)
                if reason is not None:
                    self.running.remove(req)
                    self._release(req)
                    self.core.finish(req, reason, now)

    def gauges(self) -> dict[str, Any]:
        return {
            "running": len(self.running),
            "waiting": len(self.waiting),
            "deferred": 0,
            "kv_blocks_pinned": self.pool.pinned,
            "kv_blocks_total": self.pool.num_blocks,
            "kv_blocks_cached": self.pool.cached,
            "kv_usage": self.pool.usage,
        }

    def clear_cache(self) -> None:
        self.pool.clear_cache()

    # --- running requests ------------------------------------------------------
    def _schedule_running(self, planned: dict[SimRequest, Work], budget: int) -> tuple[int, bool]:
        preempted = False
        idx = 0
        while idx < len(self.running) and budget > 0:
            req = self.running[idx]
            n = min(req.num_tokens - req.num_computed, budget)
            decode = req.num_computed >= req.num_tokens - 1 and req.record.first_token is not None
            while not self._grow(req, req.num_computed + n):
                victim = self._pick_victim()
                if self.running.index(victim) < idx:
                    idx -= 1
                budget += planned.pop(victim).n if victim in planned else 0
                self._preempt(victim)
                preempted = True
                if victim is req:
                    break
            else:
                planned[req] = Work(req, n, decode)
                budget -= n
                idx += 1
        return budget, preempted

    def _grow(self, req: SimRequest, tokens: int) -> bool:
        need = -(-tokens // self._bs) - len(req.blocks)
        if need <= 0:
            return True
        if self.pool.available < need:
            return False
        req.blocks.extend(self.pool.allocate(need))
        return True

    def _pick_victim(self) -> SimRequest:
        if self.config.scheduling_policy == "priority":
            return max(self.running, key=lambda r: (r.priority, r.record.arrival))
        return self.running[-1]

    def _preempt(self, req: SimRequest) -> None:
        self.running.remove(req)
        self._release(req)
        req.num_computed = 0
        req.state = State.WAITING
        req.record.preemptions += 1
        self.core.totals.preemptions += 1
        self.waiting.push(req, front=True)

    # --- waiting requests ------------------------------------------------------
    def _schedule_waiting(self, planned: dict[SimRequest, Work], budget: int) -> None:
        while len(self.waiting) and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.waiting.peek()
            hit = self._admit(req, budget)
            if hit is None:
                break
            self.waiting.pop()
            n = min(req.num_tokens - req.num_computed, budget)
            planned[req] = Work(req, n, decode=False)
            budget -= n

    def _admit(self, req: SimRequest, budget: int) -> int | None:
        """Pin the cached prefix and the blocks of the first chunk; None if short."""
        num_tokens = req.num_tokens
        self._extend_hashes(req, num_tokens // self._bs)
        hit = self.pool.lookup(req.hashes, (num_tokens - 1) // self._bs)
        hit_tokens = len(hit) * self._bs
        n = min(num_tokens - hit_tokens, budget)
        new_blocks = -(-(hit_tokens + n) // self._bs) - len(hit)
        blocks = self.pool.acquire(hit, new_blocks)
        if blocks is None:
            return None
        req.blocks, req.cached_blocks = blocks, len(hit)
        req.num_computed = hit_tokens
        req.state = State.RUNNING
        self.running.append(req)
        self._count_prefix(req, num_tokens, hit_tokens)
        return hit_tokens

    def _count_prefix(self, req: SimRequest, queried: int, hit: int) -> None:
        totals = self.core.totals
        totals.prefix_queries_tokens += queried
        totals.prefix_hits_tokens += hit
        if not req.scheduled_once:
            req.scheduled_once = True
            req.record.cached_tokens = hit
            if self.config.enable_prefix_caching:
                whole = req.record.prompt_tokens // self._bs * self._bs
                req.record.created_cache_tokens = max(whole - hit, 0)
            req.record.scheduled = self.core.clock.now()

    # --- blocks ----------------------------------------------------------------
    def _extend_hashes(self, req: SimRequest, full_blocks: int) -> None:
        if len(req.hashes) < full_blocks:
            extend_hashes(
                req.hashes, full_blocks, req.token_range, self._bs, salt_root(req.cache_salt)
            )

    def _cache_full_blocks(self, req: SimRequest) -> None:
        full = req.num_computed // self._bs
        if full <= req.cached_blocks:
            return
        self._extend_hashes(req, full)
        start = req.cached_blocks
        new = [i for i in range(start, full) if self.pool.cache(req.blocks[i], req.hashes[i])]
        req.cached_blocks = full
        if new and self.publisher is not None:
            self._publish_stored(req, new)

    def _publish_stored(self, req: SimRequest, new: list[int]) -> None:
        """One `BlockStored` per run of consecutive newly cached blocks."""
        assert self.publisher is not None
        runs: list[list[int]] = []
        for i in new:
            if runs and runs[-1][-1] == i - 1:
                runs[-1].append(i)
            else:
                runs.append([i])
        for run in runs:
            parent = req.hashes[run[0] - 1] if run[0] else None
            tokens = req.token_range(run[0] * self._bs, (run[-1] + 1) * self._bs)
            self.publisher.stored([req.hashes[i] for i in run], parent, tokens)

    def _release(self, req: SimRequest) -> None:
        self.pool.release(req.blocks)
        req.blocks = []
        req.cached_blocks = 0
