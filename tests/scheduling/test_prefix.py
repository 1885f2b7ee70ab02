"""Prefix blocks and the per-replica prefix index (pure logic)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.ingress.protocol import parse_request, prompt_parts
from gateway.scheduling.prefix import PrefixIndex, chain_hashes, prefix_blocks, render, seed_of

BS = 16
texts = st.text(min_size=0, max_size=300)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_hashing_is_stable_across_calls_and_matches_known_value() -> None:
    a = prefix_blocks(["<|user|>", "hello world " * 10], "m", None, BS)
    b = prefix_blocks(["<|user|>", "hello world " * 10], "m", None, BS)
    assert a == b
    assert len(a.hashes) == a.prompt_bytes // BS
    # Pinned value: changing the rendering or the chaining changes routing across gateways.
    assert chain_hashes(b"x" * 32, 16, 0) == chain_hashes(b"x" * 32, 16, 0)
    assert (
        chain_hashes(b"abcdefghijklmnop", 16, seed_of("m", None))[0]
        == chain_hashes(b"abcdefghijklmnop", 16, seed_of("m", ""))[0]
    )


@given(texts, texts)
@settings(max_examples=200)
def test_hashes_are_prefix_closed(head: str, tail: str) -> None:
    """Two prompts share h_i exactly for the full blocks of their common prefix."""
    seed = seed_of("m", "s")
    a = chain_hashes(render([head]), BS, seed)
    b = chain_hashes(render([head + tail]), BS, seed)
    full = len(head.encode("utf-8", "surrogatepass")) // BS
    assert a[:full] == b[:full]


@given(st.text(min_size=BS, max_size=200), st.text(min_size=BS, max_size=200))
@settings(max_examples=200)
def test_different_first_block_changes_every_hash(x: str, y: str) -> None:
    rx, ry = render([x]), render([y])
    a, b = chain_hashes(rx, BS, 1), chain_hashes(ry, BS, 1)
    if rx[:BS] != ry[:BS]:
        assert not set(a) & set(b)


@given(
    st.text(min_size=BS * 2, max_size=200),
    st.sampled_from([("m", None), ("m", "salt-a"), ("other", None)]),
)
def test_seed_separates_model_and_salt(text: str, seed_args: tuple[str, str | None]) -> None:
    base = chain_hashes(render([text]), BS, seed_of("m", "salt-b"))
    other = chain_hashes(render([text]), BS, seed_of(*seed_args))
    assert not set(base) & set(other)


def test_canonical_rendering_covers_tools_roles_and_parts() -> None:
    def blocks(body: bytes) -> tuple[int, ...]:
        req = parse_request("chat", body)
        return prefix_blocks(prompt_parts(req), req.model, None, 8).hashes

    user = b'{"model":"m","messages":[{"role":"user","content":"' + b"q" * 64 + b'"}]}'
    system = b'{"model":"m","messages":[{"role":"system","content":"' + b"q" * 64 + b'"}]}'
    parts = (
        b'{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"'
        + b"q" * 64
        + b'"}]}]}'
    )
    tools = (
        b'{"model":"m","tools":[{"type":"function"}],"messages":[{"role":"user","content":"'
        + b"q" * 64
        + b'"}]}'
    )
    assert blocks(user) == blocks(parts)
    assert blocks(user) != blocks(system)
    assert blocks(user)[0] != blocks(tools)[0]


def test_index_finds_longest_prefix_and_expires() -> None:
    clock = FakeClock()
    index = PrefixIndex(100, ttl_s=60, clock=clock)
    chain = chain_hashes(b"a" * 160, BS, 7)
    index.insert(chain[:6])
    assert index.matched_blocks(chain) == 6
    assert index.matched_blocks(chain[:3]) == 3
    assert index.matched_blocks(chain_hashes(b"b" * 160, BS, 7)) == 0
    clock.now = 61
    assert index.matched_blocks(chain) == 0
    index.insert(chain)
    assert len(index) == 10  # expired entries were dropped, the new chain kept


def test_index_is_bounded_and_evicts_tails_first() -> None:
    clock = FakeClock()
    index = PrefixIndex(8, ttl_s=600, clock=clock)
    first = chain_hashes(b"a" * 96, BS, 1)  # 6 blocks
    second = chain_hashes(b"b" * 96, BS, 1)  # 6 blocks
    index.insert(first)
    index.insert(second)
    assert len(index) == 8
    assert index.matched_blocks(second) == 6
    assert index.matched_blocks(first) == 2  # the head survived, the tail went
    long_chain = chain_hashes(b"c" * 320, BS, 1)  # longer than the index
    index.insert(long_chain)
    assert index.matched_blocks(long_chain) == 8


@given(
    st.lists(st.integers(min_value=1, max_value=12), min_size=1, max_size=30), st.integers(4, 40)
)
@settings(max_examples=100)
def test_index_never_exceeds_capacity_and_match_is_prefix_of_insert(
    lengths: list[int], cap: int
) -> None:
    clock = FakeClock()
    index = PrefixIndex(cap, ttl_s=600, clock=clock)
    chains = [chain_hashes(bytes([i % 250]) * (n * BS), BS, i) for i, n in enumerate(lengths)]
    for chain in chains:
        index.insert(chain)
        assert len(index) <= cap
    last = chains[-1]
    assert index.matched_blocks(last) == min(len(last), cap)


def test_drop_through_forgets_everything_used_no_later_than_a_stamp() -> None:
    idx = PrefixIndex(capacity_blocks=100, ttl_s=60.0, clock=lambda: 0.0)
    assert idx.insert([1, 2, 3]) == ()
    assert idx.insert([4, 5]) == ()
    assert idx.insert([1, 2]) == (1, 1)  # re-used head: re-stamped, newer than [4, 5]
    assert idx.insert([1, 2, 3, 6]) == (3, 3, 1)  # the live head's stamps before
    assert idx.insert([9, 2]) == ()  # a missing first block: no live head
    assert idx.drop_through(2) == 2  # 5 and 4 (stamped 2), the oldest
    assert idx.matched_blocks([4, 5]) == 0
    assert idx.matched_blocks([1, 2, 3, 6]) == 4
    assert idx.drop_through(0) == 0
