"""Prompt → chained block hashes, and a per-replica index of recent prefixes.

The prompt is rendered canonically (`protocol.prompt_parts`: tools, then each
message's role and content parts in order; a completions prompt as is),
encoded as UTF-8 and cut into fixed-size byte blocks. Block `i` hashes as
`h_i = xxh3_64(block_i, seed=h_{i-1})`, with `h_{-1}` derived from the model
name and the body's `cache_salt`. A hash therefore names a whole prefix: two
prompts share `h_i` exactly when they share the first `i + 1` blocks, model
and salt. Only full blocks are hashed (engines cache full blocks only).

`PrefixIndex` remembers which hashes were recently sent to one replica (LRU
bounded by the replica's KV capacity in blocks, entries expiring after a
TTL). Inserting a chain tail-first keeps the head most recently used, so
eviction removes tails before heads, as engines do, and the set of live
hashes of one chain stays prefix-closed: the longest cached prefix is found
by binary search.

Each insert stamps its hashes with a counter that grows per insert, so the
entries are ordered by stamp too. `insert` returns the stamps the chain's
live head had before, and `drop_through` forgets every entry used no later than a given
stamp: when an engine answers that it no longer held a block, it evicted (least
recently used first) everything used no later than that block as well.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

import xxhash

from gateway.request.context import PrefixBlocks

_SEP = "\x1f"


def render(parts: Iterable[str]) -> bytes:
    """Canonical bytes of a prompt given its parts (separator keeps part boundaries)."""
    return _SEP.join(parts).encode("utf-8", "surrogatepass")


@functools.lru_cache(maxsize=1024)
def seed_of(model: str | None, cache_salt: str | None) -> int:
    key = f"{model or ''}\x00{cache_salt or ''}".encode("utf-8", "surrogatepass")
    return xxhash.xxh3_64_intdigest(key)


def chain_hashes(data: bytes, block_bytes: int, seed: int) -> tuple[int, ...]:
    """`h_i = xxh3_64(block_i, seed=h_{i-1})` over the full blocks of `data`."""
    digest = xxhash.xxh3_64_intdigest
    view = memoryview(data)
    out: list[int] = []
    h = seed
    for start in range(0, len(data) - block_bytes + 1, block_bytes):
        h = digest(view[start : start + block_bytes], h)
        out.append(h)
    return tuple(out)


def prefix_blocks(
    parts: Iterable[str], model: str | None, cache_salt: str | None, block_bytes: int
) -> PrefixBlocks:
    data = render(parts)
    seed = seed_of(model, cache_salt)
    return PrefixBlocks(chain_hashes(data, block_bytes, seed), len(data), block_bytes)


class PrefixIndex:
    """Recently routed block hashes of one replica: bounded LRU with expiry."""

    def __init__(self, capacity_blocks: int, ttl_s: float, clock: Callable[[], float]) -> None:
        self.capacity_blocks = max(1, capacity_blocks)
        self._ttl = ttl_s
        self._clock = clock
        #: hash → (expiry, stamp), oldest first
        self._entries: OrderedDict[int, tuple[float, int]] = OrderedDict()
        self._stamp = 0

    def __len__(self) -> int:
        return len(self._entries)

    def resize(self, capacity_blocks: int) -> None:
        self.capacity_blocks = max(1, capacity_blocks)
        self._evict(self._clock())

    def insert(self, hashes: Sequence[int]) -> tuple[int, ...]:
        """Remember a routed chain (tail first, so the head is evicted last).
        Returns the stamps its live head (the `matched_blocks` leading blocks) had
        before."""
        now = self._clock()
        self._stamp += 1
        entry = (now + self._ttl, self._stamp)
        entries = self._entries
        pop = entries.pop
        before: list[int] = []
        for h in hashes[: self.capacity_blocks][::-1]:
            old = pop(h, None)
            entries[h] = entry
            if old is None or old[0] <= now:
                before.clear()  # a block missing here ends the live head
            else:
                before.append(old[1])
        self._evict(now)
        return tuple(reversed(before))

    def drop_through(self, stamp: int) -> int:
        """Forget every entry stamped `stamp` or earlier; returns how many went."""
        entries = self._entries
        dropped = 0
        while entries and next(iter(entries.values()))[1] <= stamp:
            entries.popitem(last=False)
            dropped += 1
        return dropped

    def matched_blocks(self, hashes: Sequence[int]) -> int:
        """Number of leading blocks of `hashes` present (binary search: prefix-closed)."""
        now = self._clock()
        lo, hi = 0, len(hashes)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._live(hashes[mid - 1], now):
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _live(self, h: int, now: float) -> bool:
        entry = self._entries.get(h)
        return entry is not None and entry[0] > now

    def _evict(self, now: float) -> None:
        entries = self._entries
        while len(entries) > self.capacity_blocks:
            entries.popitem(last=False)
        while entries:
            h, (expiry, _) = next(iter(entries.items()))
            if expiry > now:
                break
            del entries[h]
