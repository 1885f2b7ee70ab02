"""`FailoverStore` over a real `redis-server`: outages in `open` and `closed`
mode, recovery, startup without Redis, and bounded waits when Redis hangs."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Literal

import pytest
import redis.asyncio as aioredis

from gateway.errors import StateUnavailable
from gateway.observability.metrics import GatewayMetrics
from gateway.state import Claim, MemoryStateStore
from gateway.state.failover import FailoverStore
from gateway.state.redis import RedisStateStore
from tests.redisserver import RedisServer

pytestmark = pytest.mark.redis

PROBE_S = 0.05
CONNECT_S = 0.2
COMMAND_S = 0.2
CALL_S = CONNECT_S + COMMAND_S


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    srv = RedisServer(tmp_path, extra_args=("--enable-debug-command", "yes"))
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


class Setup:
    def __init__(self, server: RedisServer, on_failure: Literal["open", "closed"]) -> None:
        self.metrics = GatewayMetrics()
        self.fallback = MemoryStateStore()
        shared = RedisStateStore.from_settings(
            server.url,
            sentinel_master=None,
            sentinel_nodes=None,
            cluster=False,
            pool_size=4,
            connect_timeout_s=CONNECT_S,
            command_timeout_s=COMMAND_S,
            key_prefix="test:",
            lease_ttl_s=5.0,
        )
        self.store = FailoverStore(
            shared,
            self.fallback,
            on_failure=on_failure,
            probe_interval_s=PROBE_S,
            call_timeout_s=None,  # as the app builds it: the Redis store bounds its calls
            metrics=self.metrics,
        )

    def metric(self, name: str) -> float:
        value = self.metrics.registry.get_sample_value(name)
        assert value is not None, name
        return value


async def wait_until(cond: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def timed(call: Awaitable[object]) -> float:
    t0 = time.monotonic()
    await call
    return time.monotonic() - t0


def claim(limit: int = 1) -> list[Claim]:
    return [Claim("{t}:c", 1, limit)]


def test_open_mode_falls_back_and_recovers(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    async def run() -> None:
        s = Setup(server, "open")
        await s.store.start()
        try:
            assert s.store.up and s.metric("gateway_state_store_up") == 1
            shared = (await s.store.reserve(claim(), 30)).reservation
            assert shared is not None

            server.stop()
            # The failing call is retried on the fallback: local limits, fresh counters.
            local = (await s.store.reserve(claim(), 30)).reservation
            assert local is not None
            assert not s.store.up and s.store.ready
            assert not (await s.store.reserve(claim(), 30)).ok  # the local limit holds
            assert s.metric("gateway_state_store_up") == 0
            assert s.metric("gateway_state_store_fallbacks_total") == 1
            # A lease made in Redis before the outage: released without raising.
            assert await timed(s.store.release(shared)) < 0.05

            server.start()
            await wait_until(lambda: s.store.up)
            assert s.metric("gateway_state_store_up") == 1
            # Back on Redis (restarted empty), while the local lease still goes home.
            assert (await s.store.reserve(claim(), 30)).ok
            await s.store.release(local)
            assert await s.fallback.get(["{t}:c"]) == [0]
        finally:
            await s.store.close()

    with caplog.at_level(logging.WARNING, logger="gateway.state"):
        asyncio.run(run())
    transitions = [r.getMessage() for r in caplog.records if r.name == "gateway.state"]
    assert len(transitions) == 2, transitions  # one down, one up
    assert "serving with in-process limits" in transitions[0]
    assert "available again" in transitions[1]


def test_closed_mode_refuses_fast_while_down(server: RedisServer) -> None:
    async def run() -> None:
        s = Setup(server, "closed")
        await s.store.start()
        try:
            held = (await s.store.reserve(claim(5), 30)).reservation
            assert held is not None
            server.stop()
            for _ in range(20):
                t0 = time.monotonic()
                with pytest.raises(StateUnavailable) as exc:
                    await s.store.reserve(claim(5), 30)
                assert time.monotonic() - t0 < 1.0
            assert exc.value.status == 503 and exc.value.reason == "state_unavailable"
            assert exc.value.code == "state_unavailable"
            assert exc.value.retry_after == PROBE_S
            assert not s.store.ready
            # Only the first call waited for Redis; the others were refused at once.
            assert await _refusal_time(s.store.get(["k"])) < 0.01
            with pytest.raises(StateUnavailable):
                await s.store.renew(held, 30)
            # Release and settle never raise for an outage.
            await s.store.settle(held, {"{t}:c": 1})
            await s.store.release(held)
            assert s.metric("gateway_state_store_fallbacks_total") == 1

            server.start()
            await wait_until(lambda: s.store.ready)
            assert (await s.store.reserve(claim(5), 30)).ok
        finally:
            await s.store.close()

    asyncio.run(run())


async def _refusal_time(call: Awaitable[object]) -> float:
    t0 = time.monotonic()
    with pytest.raises(StateUnavailable):
        await call
    return time.monotonic() - t0


@pytest.mark.parametrize("on_failure", ["open", "closed"])
def test_startup_without_redis(server: RedisServer, on_failure: Literal["open", "closed"]) -> None:
    server.stop()

    async def run() -> None:
        s = Setup(server, on_failure)
        assert await timed(s.store.start()) < CALL_S + 0.5  # never raises, never hangs
        try:
            assert not s.store.up
            assert s.store.ready is (on_failure == "open")
            if on_failure == "open":
                assert (await s.store.reserve(claim(), 30)).ok
                assert await s.store.put("k", 7) == 7
            else:
                assert await _refusal_time(s.store.reserve(claim(), 30)) < 0.01
            server.start()
            await wait_until(lambda: s.store.up)
            assert s.store.ready
            assert await s.store.get(["k"]) == [0]  # from Redis now
        finally:
            await s.store.close()

    asyncio.run(run())


async def _hang_redis(server: RedisServer, seconds: float) -> asyncio.Task[object]:
    """Make the real server unresponsive for `seconds` (DEBUG SLEEP)."""
    client = aioredis.Redis(host="127.0.0.1", port=server.port)

    async def sleep() -> object:
        try:
            return await client.execute_command("DEBUG", "SLEEP", str(seconds))
        finally:
            await client.aclose()

    task = asyncio.get_running_loop().create_task(sleep())
    await asyncio.sleep(0.05)  # the command reached the server
    return task


@pytest.mark.parametrize("on_failure", ["open", "closed"])
def test_no_call_waits_beyond_the_timeout_when_redis_hangs(
    server: RedisServer, on_failure: Literal["open", "closed"]
) -> None:
    async def run() -> None:
        s = Setup(server, on_failure)
        await s.store.start()
        try:
            held = (await s.store.reserve(claim(5), 30)).reservation
            assert held is not None
            hang = await _hang_redis(server, 1.5)
            t0 = time.monotonic()
            if on_failure == "open":
                assert (await s.store.reserve(claim(5), 30)).ok  # served locally
            else:
                with pytest.raises(StateUnavailable):
                    await s.store.reserve(claim(5), 30)
            assert time.monotonic() - t0 < CALL_S + 0.2
            assert not s.store.up
            assert await timed(s.store.release(held)) < 0.05
            await hang
            await wait_until(lambda: s.store.up)
        finally:
            await s.store.close()

    asyncio.run(run())


def test_a_release_that_hangs_is_bounded_and_does_not_raise(server: RedisServer) -> None:
    async def run() -> None:
        s = Setup(server, "closed")
        await s.store.start()
        try:
            held = (await s.store.reserve(claim(5), 30)).reservation
            assert held is not None
            hang = await _hang_redis(server, 1.5)
            assert await timed(s.store.release(held)) < CALL_S + 0.2
            assert not s.store.up
            await hang
        finally:
            await s.store.close()

    asyncio.run(run())


def test_a_burst_beyond_the_pool_queues_and_is_no_outage(server: RedisServer) -> None:
    """More concurrent calls than connections wait for one; none is taken for
    an outage (the pool has 4 connections, 1000 calls arrive at once)."""

    async def scenario() -> tuple[int, float]:
        s = Setup(server, "open")
        await s.store.start()
        try:
            claims = [Claim("adm:{r}:kv", 10, 100_000)]
            slow = aioredis.Redis(port=server.port)
            # Redis busy for most of a command timeout while the burst arrives.
            pause = asyncio.create_task(slow.execute_command("DEBUG", "SLEEP", COMMAND_S * 0.9))
            await asyncio.sleep(0.01)
            results = await asyncio.gather(*(s.store.reserve(claims, 30.0) for _ in range(1000)))
            await pause
            await slow.aclose()
            await asyncio.gather(*(s.store.release(r.reservation) for r in results if r.ok))
            return sum(r.ok for r in results), s.metric("gateway_state_store_fallbacks_total")
        finally:
            await s.store.close()

    ok, fallbacks = asyncio.run(scenario())
    assert ok == 1000
    assert fallbacks == 0
