"""Token counting: the estimator's bound (hypothesis) and the engine counter's fallback/cache."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.config.schema import ReplicaConfig, TokensConfig, UpstreamConfig
from gateway.forward.upstream import UpstreamClient
from gateway.ingress.protocol import parse_request
from gateway.policy.estimate import estimate_text
from gateway.policy.tokens import (
    LRU,
    OFFLOAD_BYTES,
    EngineCounter,
    TokenCount,
    estimate_request,
)
from gateway.replicas.registry import Replica
from gateway.request.later import Later
from gateway.sim.cluster import SimCluster
from gateway.sim.tokens import count_tokens, render_chat, tokenize

ENGLISH = "The quick brown fox jumps over the lazy dog while the engineers measure latency."
SPANISH = (
    "La pasarela cuenta los tokens de entrada, reserva el peor caso y sólo deja pasar lo que cabe."
)
CODE = "def handle(ctx: RequestContext) -> None:\n    if ctx.deadline is None:\n        return\n"

text_st = st.one_of(
    st.text(max_size=400),
    st.text(
        alphabet=st.sampled_from(
            list("abcdefghijklmnopqrstuvwxyzABCDEZ áéíóúñ¿¡0123456789 \n\t(){}[]:;,._=-+*/\"'#")
        ),
        max_size=600,
    ),
    st.lists(
        st.sampled_from([ENGLISH, SPANISH, CODE, "    ", "\n\n", "12345", "getUserById"]),
        max_size=12,
    ).map("".join),
)


@settings(max_examples=400, deadline=None)
@given(text=text_st)
def test_estimate_never_below_simulator_tokenizer(text: str) -> None:
    assert estimate_text(text) >= count_tokens(text)


messages_st = st.lists(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["system", "user", "assistant", "tool", "developer"]),
            "content": text_st,
        }
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=200, deadline=None)
@given(messages=messages_st, tools=st.booleans())
def test_request_estimate_covers_chat_template(messages: list[dict[str, str]], tools: bool) -> None:
    body: dict[str, object] = {"model": "m", "messages": messages}
    tool_list = [
        {"type": "function", "function": {"name": "grep", "parameters": {"type": "object"}}}
    ]
    if tools:
        body["tools"] = tool_list
    req = parse_request("chat", json.dumps(body).encode())
    assert estimate_request(req) >= len(
        tokenize(render_chat(messages, tool_list if tools else None))
    )


def test_estimate_is_conservative_but_not_absurd_on_samples() -> None:
    for sample in (ENGLISH, SPANISH, CODE):
        real = count_tokens(sample)
        assert real <= estimate_text(sample) <= 3 * real


def test_lru_is_bounded() -> None:
    lru = LRU(3)
    for i in range(10):
        lru.put(str(i), i)
    assert len(lru) == 3 and lru.get("0") is None and lru.get("9") == 9


@pytest.fixture(scope="module")
def sims() -> Iterator[SimCluster]:
    with SimCluster.start(1, flavor="llamacpp", speed=50) as cluster:
        yield cluster


def _replica(url: str, kind: str) -> Replica:
    r = Replica(ReplicaConfig(url=url, kind=kind))  # type: ignore[arg-type]
    r.health.healthy = True
    return r


@contextlib.asynccontextmanager
async def _llamacpp_counter(url: str) -> AsyncIterator[tuple[EngineCounter, Replica]]:
    client = UpstreamClient(UpstreamConfig())
    await client.start()
    try:
        yield EngineCounter(client, TokensConfig(engine_timeout_s=5)), _replica(url, "llamacpp")
    finally:
        await client.close()


def test_engine_counter_llamacpp_apply_template_then_tokenize_and_cache(sims: SimCluster) -> None:
    messages = [{"role": "user", "content": "hola, ¿qué tal?"}]
    req = parse_request("chat", json.dumps({"model": "sim-model", "messages": messages}).encode())

    async def run() -> list[tuple[int, str]]:
        async with _llamacpp_counter(sims.urls[0]) as (counter, replica):
            pending = counter.count_now(req, [replica])
            assert isinstance(pending, Later)  # needs the engine
            first = await pending
            second = counter.count_now(req, [replica])  # cached: known without a round trip
            assert isinstance(second, TokenCount)
            assert await counter.count(req, [replica]) == second
            down = _replica("http://127.0.0.1:1", "vllm")
            other = parse_request(
                "chat",
                json.dumps({"model": "x", "messages": [{"role": "user", "content": "z"}]}).encode(),
            )
            fallback = await counter.count(other, [down])
            return [
                (first.tokens, first.source),
                (second.tokens, second.source),
                (fallback.tokens, fallback.source),
            ]

    (n1, s1), (n2, s2), (n3, s3) = asyncio.run(run())
    assert (s1, s2, s3) == ("engine", "cache", "fallback")
    assert n1 == n2 == len(tokenize(render_chat(messages)))
    assert n3 >= 1


def test_engine_counter_counts_a_large_prompt_off_the_loop(sims: SimCluster) -> None:
    """A body from `OFFLOAD_BYTES` on: key, payload and answer handled in a worker thread."""
    messages = [{"role": "user", "content": ENGLISH * (OFFLOAD_BYTES // len(ENGLISH) + 1)}]
    req = parse_request("chat", json.dumps({"model": "sim-model", "messages": messages}).encode())
    assert req.size >= OFFLOAD_BYTES

    async def run() -> tuple[TokenCount, TokenCount]:
        async with _llamacpp_counter(sims.urls[0]) as (counter, replica):
            pending = counter.count_now(req, [replica])
            assert isinstance(pending, Later)
            first = await pending
            again = counter.count_now(req, [replica])
            assert isinstance(again, Later)  # the cache key is hashed off the loop too
            return first, await again

    first, again = asyncio.run(run())
    assert first == TokenCount(len(tokenize(render_chat(messages))), "engine")
    assert again == TokenCount(first.tokens, "cache")
