"""The behaviour every `StateStore` shares, run against both stores (the
memory store on a fake clock, Redis in real time with short windows)."""

from __future__ import annotations

import pytest

from gateway.state import Claim, Stamp, TextRead, TextWrite
from tests.state.conftest import StoreEnv

# Hash-tagged like the callers' keys, so the suite also fits a cluster.
A, B, W = "t:{x}:a", "t:{x}:b", "t:{x}:w"


def test_reserve_is_all_or_nothing(env: StoreEnv) -> None:
    async def scenario() -> None:
        store = env.open()
        try:
            refused = await store.reserve([Claim(A, 4, 10), Claim(B, 6, 5)], ttl_s=30)
            assert not refused.ok
            assert (refused.failed_key, refused.current, refused.limit) == (B, 0, 5)
            assert refused.retry_after_s is None  # a plain counter: nothing drops out
            assert await store.get([A, B]) == [0, 0]
            ok = await store.reserve([Claim(A, 4, 10), Claim(B, 5, 5)], ttl_s=30)
            assert ok.ok and await store.get([A, B]) == [4, 5]
            assert not (await store.reserve([Claim(A, 1, 10), Claim(B, 1, 5)], 30)).ok
            # amount 0 never fails; no limit never fails
            assert (await store.reserve([Claim(B, 0, 5), Claim(A, 100)], 30)).ok
            assert await store.get([A, B, "t:{x}:missing"]) == [104, 5, 0]
        finally:
            await store.close()

    env.run(scenario)


def test_settle_keeps_actual_and_is_idempotent(env: StoreEnv) -> None:
    async def scenario() -> None:
        store = env.open()
        try:
            res = (await store.reserve([Claim(A, 10, 100), Claim(B, 3, 100)], 30)).reservation
            assert res is not None
            await store.settle(res, {A: 4})
            assert await store.get([A, B]) == [4, 0]
            await store.settle(res, {A: 4})
            await store.release(res)
            assert await store.get([A, B]) == [4, 0]
            other = (await store.reserve([Claim(A, 7, 100)], 30)).reservation
            assert other is not None and other.id != res.id
            await store.release(other)
            await store.release(other)
            assert await store.get([A]) == [4]
            assert not await store.renew(other, 30)
        finally:
            await store.close()

    env.run(scenario)


def test_unsettled_reservation_rolls_back_after_its_ttl(env: StoreEnv) -> None:
    async def scenario() -> None:
        store = env.open()
        try:
            res = (await store.reserve([Claim(A, 5, 10)], ttl_s=0.3)).reservation
            kept = (await store.reserve([Claim(A, 2, 10)], ttl_s=0.6)).reservation
            assert res is not None and kept is not None
            assert await store.renew(kept, 30)
            await env.sleep(0.8)
            assert await store.get([A]) == [2]
            await store.settle(res, {A: 5})  # too late: nothing kept
            assert await store.get([A]) == [2]
            assert not await store.renew(res, 30)
            await store.release(kept)
            assert await store.get([A]) == [0]
        finally:
            await store.close()

    env.run(scenario)


def test_live_amounts_outlive_the_key_ttl_and_the_base_does_not(env: StoreEnv) -> None:
    async def scenario() -> None:
        store = env.open()
        try:
            first = (await store.reserve([Claim(A, 3, 10, key_ttl_s=0.4)], 30)).reservation
            assert first is not None
            await store.settle(first, {A: 3})  # base 3, expiring 0.4 s after this change
            live = (await store.reserve([Claim(A, 5, 10, key_ttl_s=0.4)], 30)).reservation
            assert live is not None and await store.get([A]) == [8]
            await env.sleep(0.7)
            assert await store.get([A]) == [5]  # the base expired, the live amount did not
            await store.release(live)
            assert await store.get([A]) == [0]
        finally:
            await store.close()

    env.run(scenario)


def test_window_amount_counts_until_its_window_ends(env: StoreEnv) -> None:
    async def scenario() -> None:
        store = env.open()
        try:
            claim = Claim(W, 2, 3, key_ttl_s=5, window_s=1.0)
            res = (await store.reserve([claim], 30)).reservation
            assert res is not None
            refused = await store.reserve([claim], 30)
            assert not refused.ok and refused.current == 2
            assert refused.retry_after_s is None  # only a live reservation holds it
            await store.settle(res, {W: 2})
            assert await store.get([W]) == [2]
            refused = await store.reserve([claim], 30)
            assert not refused.ok and refused.retry_after_s is not None
            assert 0.5 < refused.retry_after_s <= 1.0 + 1.0 / 50 + 0.01
            # released or given back: at once, whatever the window says
            other = (await store.reserve([Claim(W, 1, 3, 5, 1.0)], 30)).reservation
            assert other is not None and await store.get([W]) == [3]
            await store.release(other)
            assert await store.get([W]) == [2]
            await env.sleep(refused.retry_after_s + 0.05)
            assert await store.get([W]) == [0]
            again = (await store.reserve([claim], 30)).reservation
            assert again is not None
            await store.settle(again, {W: 1})  # 1 counts on, 1 given back at once
            assert await store.get([W]) == [1]
        finally:
            await store.close()

    env.run(scenario)


def test_retry_after_is_when_enough_drops_out(env: StoreEnv) -> None:
    async def scenario() -> None:
        store = env.open()
        try:
            for _ in range(2):
                res = (await store.reserve([Claim(W, 2, 4, 5, 1.0)], 30)).reservation
                assert res is not None
                await store.settle(res, {W: 2})
                await env.sleep(0.4)
            # 2 drop out ~0.2 s from now, 2 more ~0.6 s from now
            need_two = await store.reserve([Claim(W, 2, 4, 5, 1.0)], 30)
            need_four = await store.reserve([Claim(W, 4, 4, 5, 1.0)], 30)
            too_big = await store.reserve([Claim(W, 5, 4, 5, 1.0)], 30)
            assert need_two.retry_after_s is not None and need_four.retry_after_s is not None
            assert 0.1 < need_two.retry_after_s < 0.35
            assert 0.5 < need_four.retry_after_s < 0.75
            assert too_big.retry_after_s is None  # never fits
        finally:
            await store.close()

    env.run(scenario)


def test_a_burst_across_a_boundary_never_exceeds_the_window_limit(env: StoreEnv) -> None:
    """Fixed windows let 2× the limit through around a boundary; a sliding
    window never counts more than `limit` within any `window_s`."""
    limit, window = 4, 1.0

    async def scenario() -> list[float]:
        store = env.open()
        admitted: list[float] = []
        try:
            for _ in range(36):  # 36 × 0.07 s ≈ 2.5 windows
                result = await store.reserve([Claim(W, 1, limit, 5, window)], 30)
                if result.reservation is not None:
                    admitted.append(result.reservation.at)
                    await store.settle(result.reservation, {W: 1})
                await env.sleep(0.07)
        finally:
            await store.close()
        return admitted

    admitted = env.run(scenario)
    assert len(admitted) >= 2 * limit  # windows do slide: capacity came back
    for t in admitted:
        assert sum(1 for u in admitted if t - window < u <= t) <= limit


def test_stamps_apply_in_the_same_step_either_way(env: StoreEnv) -> None:
    async def scenario() -> None:
        store = env.open()
        first, last = "s:{x}:first", "s:{x}:last"
        try:
            stamps = [Stamp(first, 100, 0.5, only_if_absent=True), Stamp(last, 100, 0.5)]
            ok = await store.reserve([Claim(A, 1, 1)], 30, stamps)
            assert ok.ok and ok.stamps == (100, 100)
            stamps = [Stamp(first, 200, 0.5, only_if_absent=True), Stamp(last, 200, 0.5)]
            refused = await store.reserve([Claim(A, 1, 1)], 30, stamps)
            assert not refused.ok and refused.stamps == (100, 200)
            await env.sleep(0.3)  # the TTLs were refreshed 0.3 s ago: both still there
            assert (await store.reserve([], 30, stamps)).stamps == (100, 200)
            await env.sleep(0.7)
            assert await store.get([first, last]) == [0, 0]
            assert await store.put(first, 7, None, only_if_absent=True) == 7
            assert await store.put(first, 8, None, only_if_absent=True) == 7
            assert await store.put(first, 9) == 9 and await store.get([first]) == [9]
        finally:
            await store.close()

    env.run(scenario)


def test_reservation_time_is_the_store_clock(env: StoreEnv) -> None:
    async def scenario() -> None:
        store = env.open()
        try:
            a = (await store.reserve([Claim(A, 1)], 30)).reservation
            await env.sleep(0.2)
            b = (await store.reserve([Claim(A, 1)], 30)).reservation
            assert a is not None and b is not None
            assert 0.15 < b.at - a.at < 0.5
        finally:
            await store.close()

    env.run(scenario)


def test_text_values_expire_unless_refreshed(env: StoreEnv) -> None:
    async def scenario() -> None:
        store = env.open()
        try:
            assert await store.get_text("aff:{s}") is None
            await store.put_text("aff:{s}", "replica-ä", 0.4)
            await store.put_text("aff:{t}", "other", 0.4)
            await env.sleep(0.25)
            assert await store.get_text("aff:{s}", refresh_ttl_s=0.4) == "replica-ä"
            await env.sleep(0.25)
            assert await store.get_text("aff:{s}") == "replica-ä"
            assert await store.get_text("aff:{t}") is None
            await env.sleep(0.25)
            assert await store.get_text("aff:{s}") is None
            await store.ping()
        finally:
            await store.close()

    env.run(scenario)


def test_texts_ride_on_reserve_and_settle(env: StoreEnv) -> None:
    """A reserve reads texts (refreshing their TTL) whether or not its claims
    fit; a settle writes texts whether or not its reservation is still live."""

    async def scenario() -> None:
        store = env.open()
        try:
            await store.put_text("aff:{s}", "replica-a", 0.4)
            reads = (TextRead("aff:{s}", 0.4), TextRead("aff:{none}"))
            await env.sleep(0.25)
            ok = await store.reserve([Claim(A, 2, 3)], 30, reads=reads)
            assert ok.ok and ok.texts == ("replica-a", None)
            await env.sleep(0.25)  # refreshed by the reserve: still there
            refused = await store.reserve([Claim(A, 2, 3)], 30, (Stamp(B, 7),), reads)
            assert not refused.ok and refused.stamps == (7,)
            assert refused.texts == ("replica-a", None)
            assert ok.reservation is not None
            await store.settle(ok.reservation, {A: 1}, [TextWrite("aff:{s}", "replica-b", 0.4)])
            assert await store.get([A]) == [1]
            assert await store.get_text("aff:{s}") == "replica-b"
            # Settling again changes no counter, but the write still lands.
            await store.settle(ok.reservation, {A: 1}, [TextWrite("aff:{t}", "ä", 0.4)])
            assert await store.get([A]) == [1]
            assert await store.get_text("aff:{t}") == "ä"
            # A reservation without claims carries writes too.
            empty = (await store.reserve([], 30, reads=reads)).reservation
            assert empty is not None
            await store.settle(empty, None, [TextWrite("aff:{u}", "x", 0.4)])
            assert await store.get_text("aff:{u}") == "x"
            await env.sleep(0.5)
            assert await store.get_text("aff:{s}") is None  # the write's TTL
        finally:
            await store.close()

    env.run(scenario)


@pytest.mark.parametrize("keep", [0, 3])
def test_counters_never_go_below_zero(env: StoreEnv, keep: int) -> None:
    async def scenario() -> None:
        store = env.open()
        try:
            res = (await store.reserve([Claim(A, 5, 10, key_ttl_s=0.2)], ttl_s=0.3)).reservation
            assert res is not None
            await env.sleep(0.5)  # both the reservation and the key are gone
            await store.settle(res, {A: keep})
            assert await store.get([A]) == [0]
        finally:
            await store.close()

    env.run(scenario)
