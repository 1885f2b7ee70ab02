"""Memory-store specifics: exact window timing on an injected clock, the
sliding-window invariant under any interleaving, and bounded memory."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.state import Claim, MemoryStateStore
from gateway.state.memory import WINDOW_SLOTS, window_drop
from tests.state.conftest import FakeClock


def test_window_drop_rounds_up_to_a_slot() -> None:
    assert window_drop(0.0, 60.0) == 60.0
    assert 60.5 <= window_drop(0.5, 60.0) <= 60.5 + 60.0 / WINDOW_SLOTS
    assert window_drop(0.5, 60.0) >= 60.5  # never early: the limit holds


def test_window_timing_on_a_fake_clock() -> None:
    clock = FakeClock(0.0)
    store = MemoryStateStore(clock)

    async def run() -> None:
        res = (await store.reserve([Claim("w", 60, 60, window_s=60.0)], 30)).reservation
        assert res is not None and res.at == 0.0
        clock.now = 20.0
        await store.settle(res, {"w": 60})
        clock.now = 59.9
        refused = await store.reserve([Claim("w", 1, 60, window_s=60.0)], 30)
        assert refused.retry_after_s is not None and abs(refused.retry_after_s - 0.1) < 1e-6
        clock.now = 60.0
        assert await store.get(["w"]) == [0]
        assert (await store.reserve([Claim("w", 60, 60, window_s=60.0)], 30)).ok

    asyncio.run(run())


ops = st.lists(
    st.tuples(st.sampled_from(["reserve", "settle", "release", "tick"]), st.integers(0, 5)),
    max_size=80,
)


@settings(max_examples=150, deadline=None)
@given(ops=ops, limit=st.integers(1, 8))
def test_window_never_counts_more_than_the_limit_within_a_window(
    ops: list[tuple[str, int]], limit: int
) -> None:
    clock = FakeClock(0.0)
    store = MemoryStateStore(clock)
    window = 10.0
    kept: list[tuple[float, int]] = []  # (reserved at, amount kept)

    async def run() -> None:
        live = []
        for op, n in ops:
            if op == "reserve":
                res = await store.reserve([Claim("w", n, limit, window_s=window)], 100)
                if res.reservation is not None:
                    live.append(res.reservation)
            elif op == "settle" and live:
                res = live.pop(0)
                keep = min(n, res.claims[0].amount)
                await store.settle(res, {"w": keep})
                kept.append((res.at, keep))
            elif op == "release" and live:
                await store.release(live.pop(0))
            elif op == "tick":
                clock.now += n * 1.7
            (value,) = await store.get(["w"])
            held = sum(r.claims[0].amount for r in live)
            recent = sum(k for at, k in kept if clock.now < at + window)
            assert recent + held <= value <= limit

    asyncio.run(run())


def test_memory_stays_bounded() -> None:
    clock = FakeClock(0.0)
    store = MemoryStateStore(clock)

    async def run() -> None:
        for i in range(20_000):
            res = (await store.reserve([Claim("w", 1, None, window_s=60.0)], 30)).reservation
            assert res is not None
            await store.settle(res, {"w": 1})
            await store.put(f"session:{i}", i, 5.0)  # idle sessions nobody touches again
            await store.put_text(f"aff:{i}", "r", 5.0)
            clock.now += 0.01
        window = store._windows["w"]
        assert len(window.times) <= WINDOW_SLOTS + 1
        (in_window,) = await store.get(["w"])  # the last 60 s, and up to a slot more
        assert 6000 <= in_window <= 6000 + 100 * 60.0 / WINDOW_SLOTS
        assert store.tracked_keys < 5000  # not 40 000: expired ones were dropped

    asyncio.run(run())
