"""The Redis store's lease renewer is a supervised task: a round that raises
(a bug, not an outage: those are logged and retried in the loop) is logged and
the renewer restarted, so live reservations keep their leases. A real
`redis-server` (tests/redisserver.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import pytest

from gateway.state import Claim, Reservation
from gateway.state.redis import RedisStateStore

pytestmark = pytest.mark.redis
K = "adm:{r0}:kv"


def test_a_crashed_renewal_round_is_logged_and_renewing_goes_on(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        store = RedisStateStore.from_settings(
            redis_url, key_prefix="renewer:", connect_timeout_s=0.5, lease_ttl_s=1.5
        )
        observer = RedisStateStore.from_settings(redis_url, key_prefix="renewer:")
        real = store._renew_batch
        rounds: list[int] = []

        async def first_round_crashes(batch: Sequence[tuple[Reservation, int]]) -> list[bool]:
            rounds.append(len(batch))
            if len(rounds) == 1:
                raise RuntimeError("a bug in a renewal round")
            return await real(batch)

        store._renew_batch = first_round_crashes  # type: ignore[method-assign]
        try:
            held = (await store.reserve([Claim(K, 3, 10)], ttl_s=60)).reservation
            assert held is not None
            await asyncio.sleep(3.0)  # two lease periods: without renewals it expired
            assert len(rounds) >= 2
            assert await observer.get([K]) == [3]
            await store.release(held)
        finally:
            await store.close()
            await observer.close()

    with caplog.at_level(logging.ERROR, "gateway.supervise"):
        asyncio.run(asyncio.wait_for(scenario(), 30))
    crashes = [r for r in caplog.records if "crashed" in r.getMessage()]
    assert len(crashes) == 1 and "redis-state" in crashes[0].getMessage()
