"""The paged KV pool and its prefix cache (pure)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.sim.kv import BlockPool, block_hash, extend_hashes, salt_root


def _hashes(tokens: list[int], salt: str | None = None, bs: int = 4) -> list[int]:
    out: list[int] = []
    extend_hashes(out, len(tokens) // bs, lambda a, b: tokens[a:b], bs, salt_root(salt))
    return out


def test_hashes_chain_and_salt() -> None:
    a, b = _hashes(list(range(12))), _hashes(list(range(8)) + [9, 9, 9, 9])
    assert a[:2] == b[:2] and a[2] != b[2]
    assert _hashes([1, 2, 3, 4, 5, 6, 7, 8], "s")[0] != _hashes([1, 2, 3, 4, 5, 6, 7, 8])[0]
    assert _hashes([1, 2, 3, 4], "s") == _hashes([1, 2, 3, 4], "s")
    assert block_hash(0, [1, 2]) != block_hash(1, [1, 2])


def test_release_keeps_cached_blocks_until_evicted() -> None:
    pool = BlockPool(4)
    blocks = pool.allocate(3)
    assert pool.pinned == 3 and pool.usage == 0.75
    pool.cache(blocks[0], 100)
    pool.cache(blocks[1], 101)
    pool.release(blocks)
    assert pool.pinned == 0 and pool.cached == 2 and pool.available == 4
    assert pool.lookup([100, 101, 102], 3) == blocks[:2]
    assert pool.lookup([100, 101], 1) == blocks[:1]
    pool.allocate(2)  # the free blocks go first
    assert pool.cached == 2
    pool.allocate(1)  # then the tail (101) is evicted before the head (100)
    assert pool.lookup([100, 101], 2) == blocks[:1]


def test_acquire_revives_cached_blocks_and_counts_them() -> None:
    pool = BlockPool(3)
    blocks = pool.allocate(2)
    pool.cache(blocks[0], 7)
    pool.release(blocks)
    hit = pool.lookup([7], 1)
    assert pool.acquire(hit, 3) is None  # reviving the hit leaves only 2 blocks
    got = pool.acquire(hit, 2)
    assert got is not None and got[0] == blocks[0] and pool.pinned == 3


def test_shared_blocks_are_refcounted() -> None:
    pool = BlockPool(2)
    (b,) = pool.allocate(1)
    pool.cache(b, 5)
    again = pool.acquire(pool.lookup([5], 1), 0)
    assert again == [b]
    pool.release([b])
    assert pool.pinned == 1
    pool.release([b])
    assert pool.pinned == 0 and pool.cached == 1
    pool.clear_cache()
    assert pool.cached == 0 and pool.available == 2


def test_disabled_cache_never_hits() -> None:
    pool = BlockPool(2, enable_caching=False)
    (b,) = pool.allocate(1)
    pool.cache(b, 5)
    pool.release([b])
    assert pool.lookup([5], 1) == [] and pool.cached == 0


@given(st.lists(st.tuples(st.booleans(), st.integers(1, 3), st.integers(0, 20)), max_size=60))
def test_pinned_plus_available_is_total(ops: list[tuple[bool, int, int]]) -> None:
    pool = BlockPool(8)
    held: list[list[int]] = []
    for alloc, n, h in ops:
        if alloc and pool.available >= n:
            blocks = pool.allocate(n)
            pool.cache(blocks[0], h)
            held.append(blocks)
        elif held:
            pool.release(held.pop(0))
        assert pool.pinned + pool.available == pool.num_blocks
        assert pool.pinned == sum(len(b) for b in held)
    for blocks in held:
        pool.release(blocks)
    assert pool.pinned == 0
