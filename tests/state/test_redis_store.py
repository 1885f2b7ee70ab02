"""Redis-only behaviour: atomicity across clients, lease expiry of a dead
holder, script reloading, outages. A real `redis-server` (tests/redisserver.py)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from gateway.state import Claim, StoreUnavailable
from gateway.state.redis import CrossSlotKeys, RedisStateStore
from tests.redisserver import RedisServer, _free_port

pytestmark = pytest.mark.redis
K = "adm:{r0}:kv"


def _open(url: str, prefix: str, **kw: float) -> RedisStateStore:
    return RedisStateStore.from_settings(
        url, key_prefix=prefix, connect_timeout_s=0.5, command_timeout_s=0.5, **kw
    )


def _run(coro_fn: object) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(coro_fn(), timeout=30)  # type: ignore[operator]

    asyncio.run(bounded())


def test_concurrent_reserves_from_two_clients_never_exceed_the_limit(redis_url: str) -> None:
    async def scenario() -> None:
        a, b = _open(redis_url, "conc:"), _open(redis_url, "conc:")
        try:
            claims = [Claim(K, 1, 10), Claim("adm:{r0}:inflight", 1, None)]
            results = await asyncio.gather(*(store.reserve(claims, 30) for store in (a, b) * 25))
            won = [(s, r.reservation) for s, r in zip((a, b) * 25, results, strict=True) if r.ok]
            assert len(won) == 10
            assert await a.get([K, "adm:{r0}:inflight"]) == [10, 10]
            # settle half (keeping 1), release the rest, concurrently from both
            await asyncio.gather(
                *(
                    s.settle(res, {K: 1}) if i % 2 else s.release(res)
                    for i, (s, res) in enumerate(won)
                    if res is not None
                )
            )
            assert await b.get([K, "adm:{r0}:inflight"]) == [5, 0]
            refill = await asyncio.gather(*(a.reserve([Claim(K, 1, 10)], 30) for _ in range(20)))
            assert sum(r.ok for r in refill) == 5
        finally:
            await a.close()
            await b.close()

    _run(scenario)


def test_a_dead_holders_leases_expire_and_a_live_ones_are_renewed(redis_url: str) -> None:
    async def scenario() -> None:
        live = _open(redis_url, "lease:", lease_ttl_s=0.6)
        dead = _open(redis_url, "lease:", lease_ttl_s=0.6)
        observer = _open(redis_url, "lease:")
        try:
            kept = (await live.reserve([Claim(K, 3, 10)], ttl_s=60)).reservation
            lost = (await dead.reserve([Claim(K, 4, 10)], ttl_s=60)).reservation
            short = (await live.reserve([Claim(K, 2, 10)], ttl_s=1.0)).reservation
            assert kept is not None and lost is not None and short is not None
            await dead.close()  # a killed gateway: no release, no more renewals
            started = time.monotonic()
            while await observer.get([K]) != [5]:
                assert time.monotonic() - started < 1.5, "the dead holder's lease leaked"
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.2)  # past several lease periods and `short`'s own ttl
            assert await observer.get([K]) == [3]
            assert live.live_reservations == 1
            assert await live.renew(kept, 60)
            await live.settle(kept, {K: 1})
            assert await observer.get([K]) == [1] and live.live_reservations == 0
        finally:
            await live.close()
            await observer.close()

    _run(scenario)


def test_many_live_reservations_renew_in_batches(redis_url: str) -> None:
    async def scenario() -> None:
        store = _open(redis_url, "batch:", lease_ttl_s=0.45)
        try:
            held = [
                (await store.reserve([Claim(f"t:{{{i % 7}}}:c", 1, None)], 60)).reservation
                for i in range(600)
            ]
            await asyncio.sleep(1.0)
            keys = [f"t:{{{i}}}:c" for i in range(7)]
            assert sum(await store.get(keys)) == 600
            for res in held:
                assert res is not None
                await store.release(res)
            assert sum(await store.get(keys)) == 0
        finally:
            await store.close()

    _run(scenario)


def test_scripts_reload_after_script_flush(redis_url: str) -> None:
    async def scenario() -> None:
        store = _open(redis_url, "flush:")
        raw = Redis.from_url(redis_url)
        try:
            assert (await store.reserve([Claim(K, 1, 5)], 30)).ok
            await raw.script_flush()
            res = (await store.reserve([Claim(K, 1, 5)], 30)).reservation
            assert res is not None and await store.get([K]) == [2]
            await raw.script_flush()
            await store.release(res)
            assert await store.get([K]) == [1]
        finally:
            await store.close()
            await raw.aclose()

    _run(scenario)


def test_key_layout_and_cleanup(redis_url: str) -> None:
    async def scenario() -> None:
        store = _open(redis_url, "lay:")
        raw = Redis.from_url(redis_url)
        try:
            res = (await store.reserve([Claim(K, 5, 10, key_ttl_s=30)], 30)).reservation
            assert res is not None
            fields = await raw.hgetall("lay:" + K)
            entry = f"r:{res.id}".encode()
            assert fields[b"l"] == b"5" and fields[entry] == b"5"
            assert await raw.zscore("lay:" + K + ":e", entry) is not None
            assert 0 < await raw.pttl("lay:" + K) <= 30_000
            await store.settle(res, {K: 2})
            assert (await raw.hgetall("lay:" + K)).keys() == {b"b", b"x", b"l"}
            plain = (await store.reserve([Claim("adm:{r0}:n", 1)], 30)).reservation
            assert plain is not None
            await store.release(plain)  # nothing held, no TTL: nothing left behind
            assert await raw.exists("lay:adm:{r0}:n", "lay:adm:{r0}:n:e") == 0
        finally:
            await store.close()
            await raw.aclose()

    _run(scenario)


def test_outage_raises_store_unavailable_promptly_and_recovers(tmp_path: Path) -> None:
    server = RedisServer(tmp_path)
    server.start()

    async def scenario() -> None:
        store = _open(server.url, "out:")
        try:
            res = (await store.reserve([Claim(K, 1, 5)], 30)).reservation
            assert res is not None
            server.stop()
            for call in (
                store.reserve([Claim(K, 1, 5)], 30),
                store.settle(res, {K: 1}),
                store.get([K]),
                store.get_text("x"),
                store.put_text("x", "y", 1),
                store.ping(),
            ):
                started = time.monotonic()
                with pytest.raises(StoreUnavailable):
                    await call
                assert time.monotonic() - started < 2.0
            server.start()  # same port, empty (no persistence)
            started = time.monotonic()
            while True:
                try:
                    await store.ping()
                    break
                except StoreUnavailable:
                    assert time.monotonic() - started < 5.0
                    await asyncio.sleep(0.1)
            assert (await store.reserve([Claim(K, 1, 5)], 30)).ok
            assert await store.get([K]) == [1]
        finally:
            await store.close()

    try:
        _run(scenario)
    finally:
        server.stop()


def test_cluster_mode_refuses_keys_of_several_slots() -> None:
    async def scenario() -> None:
        client = RedisCluster.from_url("redis://127.0.0.1:1")  # never connected
        store = RedisStateStore(client, key_prefix="p:")
        with pytest.raises(CrossSlotKeys, match="hash tag"):
            await store.reserve([Claim("t:{a}:x", 1), Claim("t:{b}:x", 1)], 30)
        with pytest.raises(CrossSlotKeys):
            await store.get(["untagged"])  # K and K:e land in different slots

    _run(scenario)


def test_prefix_must_not_carry_a_hash_tag() -> None:
    with pytest.raises(ValueError, match="braces"):
        RedisStateStore(Redis(), key_prefix="{gw}:")


def test_reservation_ids_are_unique_across_instances(redis_url: str) -> None:
    async def scenario() -> None:
        a, b = _open(redis_url, "ids:"), _open(redis_url, "ids:")
        try:
            ra = (await a.reserve([Claim(K, 1)], 30)).reservation
            rb = (await b.reserve([Claim(K, 1)], 30)).reservation
            assert ra is not None and rb is not None and ra.id != rb.id
        finally:
            await a.close()
            await b.close()

    _run(scenario)


def test_a_single_node_redis_cluster_serves_the_store(tmp_path: Path) -> None:
    """`state.redis.cluster: true` against a real (one-node) Redis Cluster: the
    scripts run in the slot of their hash tag; keys of several slots are refused."""
    # The cluster bus needs a port of its own (by default port + 10000, which
    # may be taken or past 65535): give it a free one.
    bus = _free_port()
    server = RedisServer(
        tmp_path, extra_args=("--cluster-enabled", "yes", "--cluster-port", str(bus))
    )
    server.start()
    try:

        async def scenario() -> None:
            admin = Redis(port=server.port)
            await admin.execute_command("CLUSTER", "ADDSLOTSRANGE", "0", "16383")
            for _ in range(200):
                info = await admin.execute_command("CLUSTER", "INFO")
                if b"cluster_state:ok" in info:
                    break
                await asyncio.sleep(0.05)
            await admin.aclose()
            store = RedisStateStore.from_settings(
                f"redis://127.0.0.1:{server.port}/0",
                cluster=True,
                key_prefix="c:",
                connect_timeout_s=1.0,
                command_timeout_s=1.0,
            )
            try:
                claims = [Claim(K, 5, 8), Claim("adm:{r0}:inflight", 1, None)]
                first = await store.reserve(claims, 30)
                assert first.ok
                assert not (await store.reserve(claims, 30)).ok  # 5 + 5 > 8
                await store.settle(first.reservation, {K: 2})  # type: ignore[arg-type]
                assert await store.get([K]) == [2]
                with pytest.raises(CrossSlotKeys):
                    await store.reserve([Claim("adm:{r0}:kv", 1), Claim("adm:{r1}:kv", 1)], 30)
            finally:
                await store.close()

        _run(scenario)
    finally:
        server.stop()


def test_a_sentinel_managed_master_serves_the_store(tmp_path: Path) -> None:
    """`state.redis.sentinel`: the store finds the master through a real Sentinel."""
    master = RedisServer(tmp_path)
    master.start()
    sentinel_dir = tmp_path / "sentinel"
    sentinel_dir.mkdir()
    conf = sentinel_dir / "sentinel.conf"
    conf.write_text(
        f"sentinel monitor gwmaster 127.0.0.1 {master.port} 1\n"
        "sentinel down-after-milliseconds gwmaster 60000\n"
    )
    sentinel = RedisServer(sentinel_dir, extra_args=("--sentinel",))
    sentinel.leading_args = (str(conf),)  # a sentinel takes its config file first
    try:
        sentinel.start()

        async def scenario() -> None:
            store = RedisStateStore.from_settings(
                "redis:///0",
                sentinel_master="gwmaster",
                sentinel_nodes=[f"127.0.0.1:{sentinel.port}"],
                key_prefix="s:",
                connect_timeout_s=1.0,
                command_timeout_s=1.0,
            )
            try:
                result = await store.reserve([Claim(K, 3, 5)], 30)
                assert result.ok
                assert await store.get([K]) == [3]
                direct = Redis(port=master.port)
                assert await direct.exists("s:" + K) == 1  # held on the master
                await direct.aclose()
                await store.release(result.reservation)  # type: ignore[arg-type]
                assert await store.get([K]) == [0]
            finally:
                await store.close()

        _run(scenario)
    finally:
        sentinel.stop()
        master.stop()
