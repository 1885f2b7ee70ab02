"""Paged KV pool with a prefix cache, as in vLLM's block manager.

Each block holds `block_size` tokens. A full block's hash chains the parent
block's hash with the block's token ids; the first block's parent is derived
from `cache_salt` (vLLM mixes the salt into the first block only), so two
prompts share cached blocks exactly when they share a token prefix and salt.

Blocks are *pinned* while a running request references them (refcount > 0).
A released block that carries a hash stays in the cache as *evictable*; a
released block without one (a partial block, or a duplicate of a block that
was already cached) goes back to the free list. Allocation takes free blocks
first and then evicts cached blocks least recently released first (a request
releases its blocks tail first, so the tail of a prompt is evicted before its
head, as in vLLM). Approximation: vLLM keeps free and evictable blocks in one
queue, so it can evict a cached block while never-used blocks remain; this pool
always prefers never-cached blocks.

`usage` is pinned / total, the definition of `vllm:kv_cache_usage_perc`.
"""

from __future__ import annotations

import struct
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from typing import Protocol

import xxhash


class KVEventSink(Protocol):
    """Receives the pool's cache changes (`kvevents.KVEventPublisher`)."""

    def removed(self, hashes: Sequence[int]) -> None: ...

    def cleared(self) -> None: ...


def salt_root(cache_salt: str | None) -> int:
    """Parent hash of a sequence's first block."""
    if not cache_salt:
        return 0
    return xxhash.xxh3_64_intdigest(b"salt:" + cache_salt.encode())


def block_hash(parent: int, tokens: Sequence[int]) -> int:
    return xxhash.xxh3_64_intdigest(struct.pack(f"<Q{len(tokens)}I", parent, *tokens))


def extend_hashes(
    hashes: list[int],
    full_blocks: int,
    tokens: Callable[[int, int], Sequence[int]],
    block_size: int,
    root: int,
) -> None:
    """Append hashes until `hashes` covers `full_blocks` blocks; `tokens(a, b)` gives ids a:b."""
    parent = hashes[-1] if hashes else root
    for i in range(len(hashes), full_blocks):
        parent = block_hash(parent, tokens(i * block_size, (i + 1) * block_size))
        hashes.append(parent)


class BlockPool:
    """Fixed pool of KV blocks with refcounts and an LRU prefix cache."""

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self._free: deque[int] = deque(range(num_blocks))
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self._ref = [0] * num_blocks
        self._hash_of: dict[int, int] = {}
        self._block_of: dict[int, int] = {}
        self.sink: KVEventSink | None = None

    @property
    def available(self) -> int:
        """Blocks that can be allocated now (free + evictable)."""
        return len(self._free) + len(self._evictable)

    @property
    def pinned(self) -> int:
        return self.num_blocks - self.available

    @property
    def cached(self) -> int:
        return len(self._block_of)

    @property
    def usage(self) -> float:
        return self.pinned / self.num_blocks

    def lookup(self, hashes: Sequence[int], max_blocks: int) -> list[int]:
        """Cached blocks of the longest prefix of `hashes` (at most `max_blocks`)."""
        if not self.enable_caching:
            return []
        hit: list[int] = []
        for h in hashes[:max_blocks]:
            block = self._block_of.get(h)
            if block is None:
                break
            hit.append(block)
        return hit

    def acquire(self, hit: Sequence[int], new_blocks: int) -> list[int] | None:
        """Pin the `hit` blocks and allocate `new_blocks` more, or None if short."""
        reviving = sum(1 for b in hit if self._ref[b] == 0)
        if self.available - reviving < new_blocks:
            return None
        for b in hit:
            self._pin(b)
        return list(hit) + self.allocate(new_blocks)

    def allocate(self, n: int) -> list[int]:
        if n > self.available:
            raise RuntimeError(f"allocate({n}) with only {self.available} blocks available")
        out: list[int] = []
        for _ in range(n):
            block = self._free.popleft() if self._free else self._evict()
            self._ref[block] = 1
            out.append(block)
        return out

    def cache(self, block: int, h: int) -> bool:
        """Register a computed full block under hash `h` (first writer wins); True if new."""
        if self.enable_caching and h not in self._block_of and block not in self._hash_of:
            self._block_of[h] = block
            self._hash_of[block] = h
            return True
        return False

    def release(self, blocks: Sequence[int]) -> None:
        """Unpin `blocks`, tail first, so that tails are evicted before heads."""
        for block in reversed(blocks):
            self._ref[block] -= 1
            if self._ref[block] > 0:
                continue
            if block in self._hash_of:
                self._evictable[block] = None
            else:
                self._free.append(block)

    def clear_cache(self) -> None:
        """Forget every evictable cached block (pinned blocks keep their hash)."""
        for block in list(self._evictable):
            del self._block_of[self._hash_of.pop(block)]
            self._free.append(block)
        self._evictable.clear()
        if self.sink is not None:
            self.sink.cleared()

    def _pin(self, block: int) -> None:
        if self._ref[block] == 0:
            del self._evictable[block]
        self._ref[block] += 1

    def _evict(self) -> int:
        block, _ = self._evictable.popitem(last=False)
        h = self._hash_of.pop(block)
        del self._block_of[h]
        if self.sink is not None:
            self.sink.removed([h])
        return block
