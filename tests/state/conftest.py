"""Both stores behind one fixture: `env` opens a store and lets time pass
(the memory store's injected clock, real time for Redis)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import pytest

from gateway.state import MemoryStateStore, StateStore
from gateway.state.redis import RedisStateStore
from tests.redisserver import redis_server

T = TypeVar("T")
_prefixes = itertools.count(1)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    with redis_server() as server:
        yield server.url


class FakeClock:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class StoreEnv:
    """Opens stores of one kind; `sleep` lets their time pass."""

    def __init__(self, kind: str, redis_url: str | None) -> None:
        self.kind = kind
        self.redis_url = redis_url
        self.clock = FakeClock()
        self.prefix = f"test{next(_prefixes)}:"
        self._memory: MemoryStateStore | None = None

    def open(self, *, lease_ttl_s: float = 10.0) -> StateStore:
        if self.kind == "memory":
            if self._memory is None:  # one in-process store stands for "shared"
                self._memory = MemoryStateStore(self.clock)
            return self._memory
        assert self.redis_url is not None
        return RedisStateStore.from_settings(
            self.redis_url,
            key_prefix=self.prefix,
            lease_ttl_s=lease_ttl_s,
            connect_timeout_s=1.0,
            command_timeout_s=1.0,
        )

    async def sleep(self, seconds: float) -> None:
        if self.kind == "memory":
            self.clock.now += seconds
            await asyncio.sleep(0)
        else:
            await asyncio.sleep(seconds)

    def run(self, scenario: Callable[[], Awaitable[T]]) -> T:
        async def wrapped() -> T:
            return await asyncio.wait_for(scenario(), timeout=30)

        return asyncio.run(wrapped())


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def env(request: pytest.FixtureRequest) -> StoreEnv:
    url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    return StoreEnv(request.param, url)
