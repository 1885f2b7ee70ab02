"""Budgets: reserve the worst case, settle with usage; never negative, never over."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.config.schema import GatewayConfig, TenantConfig
from gateway.errors import RateLimited
from gateway.pipeline import release
from gateway.policies.policyset import Policy, SessionSpec
from gateway.policy.budgets import Budgets
from gateway.request.context import Exchange, RequestContext, Usage
from gateway.sim.cluster import SimCluster
from gateway.state import Claim, MemoryStateStore
from tests import ctxkit
from tests.gwharness import running_gateway


class FakeClock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make_ctx(
    *,
    tenant: str | None = None,
    session: str | None = None,
    policy: Policy | None = None,
    prompt: int = 10,
    output: int = 20,
) -> RequestContext:
    return ctxkit.make_ctx(
        tenant=tenant, session=session, policy=policy, prompt=prompt, output=output
    )


def session_policy(**kw: Any) -> Policy:
    return Policy(name="agent", session=SessionSpec(**kw))


def config_with(**tenants: TenantConfig) -> GatewayConfig:
    import dataclasses

    cfg = GatewayConfig()
    return dataclasses.replace(cfg, auth=dataclasses.replace(cfg.auth, tenants=tenants))


# --- the store's invariants ------------------------------------------------------------

ops = st.lists(
    st.tuples(
        st.sampled_from(["reserve", "settle", "release", "tick"]),
        st.integers(0, 40),
        st.integers(0, 60),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops=ops, limit=st.integers(1, 100))
def test_reserve_settle_never_negative_and_never_over(
    ops: list[tuple[str, int, int]], limit: int
) -> None:
    clock = FakeClock(0.0)
    store = MemoryStateStore(clock)
    live: list[tuple[Any, int]] = []

    async def run() -> None:
        for op, amount, actual in ops:
            if op == "reserve":
                res = await store.reserve([Claim("k", amount, limit, key_ttl_s=30.0)], ttl_s=10.0)
                if res.reservation is not None:
                    live.append((res.reservation, amount))
            elif op in ("settle", "release") and live:
                reservation, reserved = live.pop(0)
                keep = min(actual, reserved)  # Budgets never keeps more than it reserved
                if op == "settle":
                    await store.settle(reservation, {"k": keep})
                else:
                    await store.release(reservation)
            elif op == "tick":
                clock.now += amount  # reservations (10 s) and the key (30 s idle) may expire
            (value,) = await store.get(["k"])
            assert 0 <= value <= limit

    asyncio.run(run())


def test_released_reservations_do_not_pile_up_until_their_ttl() -> None:
    """Admission reserves with a TTL of deadline + grace (minutes); at thousands of
    requests/s the expiry bookkeeping must follow live reservations, not rate × TTL."""
    clock = FakeClock(0.0)
    store = MemoryStateStore(clock)

    async def run() -> None:
        held = []
        for i in range(20_000):
            res = await store.reserve(
                [Claim("kv", 10, 1_000_000), Claim("inflight", 1, None)], ttl_s=630.0
            )
            assert res.reservation is not None
            held.append(res.reservation)
            if len(held) > 8:  # ~8 in flight, the rest released
                store.release_now(held.pop(0))
            if i % 100 == 0:
                clock.now += 0.01  # 2 s in all: nothing reaches its TTL
            assert store.pending_expiries <= 2 * store.live_reservations + 1100
        assert store.live_reservations == 8
        assert await store.get(["kv", "inflight"]) == [80, 8]
        clock.now += 631.0  # the 8 still held expire and are rolled back: each call
        # sweeps a bounded batch, so with a compact heap a few calls reach them
        values = [await store.get(["kv", "inflight"]) for _ in range(5)]
        assert values[-1] == [0, 0]
        assert store.live_reservations == 0

    asyncio.run(run())


# --- Budgets -----------------------------------------------------------------------------


def test_session_tokens_settle_with_usage() -> None:
    store = MemoryStateStore()
    budgets = Budgets(GatewayConfig(), store)
    policy = session_policy(max_total_tokens=100)

    async def run() -> list[int]:
        ctx = make_ctx(session="s1", policy=policy, prompt=10, output=20)
        async with release.reservation(budgets, ctx):
            ctx.exchange = Exchange(
                sent_at=0.0,
                status=200,
                usage=Usage(prompt_tokens=10, completion_tokens=5, total_tokens=15),
            )
        cut = make_ctx(session="s1", policy=policy, prompt=10, output=20)
        async with release.reservation(budgets, cut):
            cut.exchange = Exchange(
                sent_at=0.0, status=200
            )  # stream cut before usage: the reservation is kept
        never = make_ctx(session="s1", policy=policy, prompt=10, output=20)
        async with release.reservation(budgets, never):
            pass  # never reached an engine: nothing is charged
        key = budgets._session_key(ctx, with_tenant=False)
        assert key is not None
        return await store.get([key + ":tok", key + ":req"])

    assert asyncio.run(run()) == [15 + 30, 2]


def test_session_budget_refusal_is_429_without_retry() -> None:
    budgets = Budgets(GatewayConfig(), MemoryStateStore())
    policy = session_policy(max_total_tokens=50)

    async def run() -> RateLimited:
        first = make_ctx(session="s", policy=policy, prompt=10, output=20)
        async with release.reservation(budgets, first):
            with pytest.raises(RateLimited) as exc:
                async with release.reservation(
                    budgets, make_ctx(session="s", policy=policy, prompt=10, output=20)
                ):
                    pass
        return exc.value

    err = asyncio.run(run())
    assert (
        err.status == 429
        and err.code == "session_budget_exceeded"
        and err.reason == "session_tokens"
    )
    assert err.retry_after is None and err.should_retry is False


def test_session_duration_with_injected_clock() -> None:
    wall = FakeClock()
    budgets = Budgets(GatewayConfig(), MemoryStateStore(), wall=wall)
    policy = session_policy(max_duration_s=100, idle_ttl_s=1000)

    async def run() -> None:
        async with release.reservation(budgets, make_ctx(session="s", policy=policy)):
            pass
        wall.now += 99
        async with release.reservation(budgets, make_ctx(session="s", policy=policy)):
            pass
        wall.now += 2
        with pytest.raises(RateLimited) as exc:
            async with release.reservation(budgets, make_ctx(session="s", policy=policy)):
                pass
        assert exc.value.reason == "session_duration"
        assert exc.value.code == "session_budget_exceeded"

    asyncio.run(run())


def test_tenant_concurrency_released_on_every_path() -> None:
    budgets = Budgets(config_with(t=TenantConfig(max_concurrent=2)), MemoryStateStore())

    async def run() -> None:
        a, b = make_ctx(tenant="t"), make_ctx(tenant="t")
        async with release.reservation(budgets, a), release.reservation(budgets, b):
            with pytest.raises(RateLimited) as exc:
                async with release.reservation(budgets, make_ctx(tenant="t")):
                    pass
            assert exc.value.reason == "tenant_concurrency" and exc.value.retry_after == 1.0
        with pytest.raises(ValueError):
            async with release.reservation(budgets, make_ctx(tenant="t")):
                raise ValueError("boom")
        async with (
            release.reservation(budgets, make_ctx(tenant="t")),
            release.reservation(budgets, make_ctx(tenant="t")),
        ):
            pass

    asyncio.run(run())


def test_tokens_per_minute_too_big_to_ever_fit_has_no_retry_after() -> None:
    wall = FakeClock(120.0)
    budgets = Budgets(
        config_with(t=TenantConfig(tokens_per_min=100)), MemoryStateStore(), wall=wall
    )

    async def run() -> tuple[RateLimited, RateLimited]:
        with pytest.raises(RateLimited) as huge:
            async with release.reservation(budgets, make_ctx(tenant="t", prompt=90, output=20)):
                pass
        async with release.reservation(budgets, make_ctx(tenant="t", prompt=30, output=40)):
            with pytest.raises(RateLimited) as later:
                async with release.reservation(budgets, make_ctx(tenant="t", prompt=10, output=30)):
                    pass
        return huge.value, later.value

    huge, later = asyncio.run(run())
    assert huge.retry_after is None
    assert later.retry_after == pytest.approx(60.0)


# --- through a real gateway: concurrent requests stop exactly at the session budget ------

PER_REQUEST_OUTPUT = 40


def test_concurrent_requests_refused_exactly_at_session_budget(tmp_path: Path) -> None:
    messages = [{"role": "user", "content": "Plan the next step of the refactoring."}]
    with SimCluster.start(1, speed=20, max_model_len=4096) as sim:
        from gateway.sim.tokens import render_chat, tokenize

        per_request = len(tokenize(render_chat(messages))) + PER_REQUEST_OUTPUT
        allowed = 5
        (tmp_path / "agent.yaml").write_text(
            f"name: agent\ntokens: engine\nlimits: {{max_output_tokens: 100}}\n"
            f"session: {{max_total_tokens: {allowed * per_request}, idle_ttl_s: 600}}\n"
        )
        with running_gateway(sim.urls, policies=str(tmp_path)) as gw:

            async def fire() -> list[str]:
                async with gw.async_openai() as client:

                    async def one() -> str:
                        try:
                            await client.chat.completions.create(
                                model="sim-model",
                                messages=messages,
                                max_tokens=PER_REQUEST_OUTPUT,
                                extra_headers={"X-Task": "agent", "x-session-id": "chain-1"},
                                extra_body={"ignore_eos": True},
                            )
                            return "ok"
                        except openai.RateLimitError as exc:
                            assert exc.code == "session_budget_exceeded"
                            assert (
                                exc.response.headers["x-gateway-reject-reason"] == "session_tokens"
                            )
                            return "refused"

                    return list(await asyncio.gather(*(one() for _ in range(12))))

            outcomes = asyncio.run(fire())
            assert outcomes.count("ok") == allowed
            assert outcomes.count("refused") == 12 - allowed
            assert len(sim.stats(0)["requests"]) == allowed
            # Settled with real usage, which equals the reservation here: exactly at the limit.
            store = gw.gateway.store
            budgets = gw.gateway.pipeline.stages.budgets
            ctx = make_ctx(session="chain-1")
            key = budgets._session_key(ctx, with_tenant=False)
            assert key is not None
            tokens = asyncio.run(store.get([key + ":tok"]))[0]
            assert tokens == allowed * per_request
