"""The cheap lower bound on a prompt's tokens (`TokenCounter.floor`) and the
off-loop counting of large prompts: a hopeless prompt is refused before it is
counted, a large legal one is counted exactly as on the loop."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.config.schema import TokensConfig, UpstreamConfig
from gateway.errors import ContextLengthExceeded
from gateway.forward.upstream import UpstreamClient
from gateway.ingress.protocol import ParsedRequest, parse_request
from gateway.policies.policyset import LimitsSpec, Policy
from gateway.policy.estimate import estimate_text, estimate_text_in_slices
from gateway.policy.limits import check_floor
from gateway.policy.tokens import (
    LRU,
    OFFLOAD_BYTES,
    EngineCounter,
    EstimateCounter,
    TokenCount,
    estimate_request,
)
from gateway.request.context import Contract
from gateway.request.later import Later

WORDS = "The quick brown fox, jumpsOver 12 lazy_dogs; ¿qué tal? Привет 世界 getUserById\n\t  "
text_st = st.one_of(
    st.text(max_size=300),
    st.text(alphabet=st.sampled_from(list(WORDS)), max_size=600),
)


def chat(messages: list[dict[str, Any]], **fields: Any) -> ParsedRequest:
    body = {"model": "m", "messages": messages, **fields}
    return parse_request("chat", json.dumps(body).encode())


@settings(max_examples=300, deadline=None)
@given(text=text_st, slice_chars=st.integers(1, 40))
def test_slices_give_exactly_the_estimate_of_the_whole_text(text: str, slice_chars: int) -> None:
    assert estimate_text_in_slices(text, slice_chars) == estimate_text(text)


message_st = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["system", "user", "assistant", "tool"]),
        "content": st.one_of(
            text_st,
            st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": text_st}), max_size=3),
        ),
    }
)


@settings(max_examples=200, deadline=None)
@given(messages=st.lists(message_st, min_size=1, max_size=6), tools=st.booleans())
def test_estimate_floor_is_never_above_the_estimate(
    messages: list[dict[str, Any]], tools: bool
) -> None:
    extra = {"tools": [{"type": "function", "function": {"name": "f"}}]} if tools else {}
    req = chat(messages, **extra)
    assert EstimateCounter().floor(req) <= estimate_request(req)


def test_estimate_floor_of_completions_counts_token_ids() -> None:
    ids = parse_request("completions", json.dumps({"prompt": list(range(4000))}).encode())
    text = parse_request("completions", json.dumps({"prompt": ["ab" * 800, "cd"]}).encode())
    assert EstimateCounter().floor(ids) == 1000 + 1 <= estimate_request(ids)
    assert EstimateCounter().floor(text) == 401 + 1 <= estimate_request(text)


def test_engine_floor_uses_the_longest_token_and_skips_assistant_text() -> None:
    counter = EngineCounter(UpstreamClient(UpstreamConfig()), TokensConfig(), bytes_per_token=512)
    req = chat(
        [
            {"role": "system", "content": " " * 1024},
            {"role": "assistant", "content": "<think>" + "x" * 100_000 + "</think>ok"},
            {"role": "user", "content": [{"type": "text", "text": "y" * 1025}, {"type": "image"}]},
        ]
    )
    assert counter.floor(req) == 5  # (1024 + 1025) / 512 rounded up; the assistant text: none


def contract(**limits: Any) -> Contract:
    return Contract(Policy(name="agent", limits=LimitsSpec(**limits)))


def test_floor_over_the_input_limit_is_the_input_limit_error() -> None:
    req = chat([{"role": "user", "content": "x"}])
    check_floor(contract(max_input_tokens=100), req, 100, 101)  # at the limit: counted
    with pytest.raises(ContextLengthExceeded) as exc:
        check_floor(contract(max_input_tokens=100), req, 101, None)
    assert (exc.value.status, exc.value.code, exc.value.param) == (
        400,
        "context_length_exceeded",
        "messages",
    )
    assert "at least 101 tokens, over the 100-token input limit of task 'agent'" in str(exc.value)


def test_floor_at_the_context_length_is_refused_naming_the_prompt() -> None:
    req = parse_request("completions", json.dumps({"prompt": "x"}).encode())
    with pytest.raises(ContextLengthExceeded) as exc:
        check_floor(contract(), req, 2048, 2048)
    assert exc.value.param == "prompt"
    assert "maximum context length is 2048 tokens" in str(exc.value)


def test_large_prompt_is_estimated_off_the_loop_exactly_and_cached() -> None:
    text = (WORDS * (OFFLOAD_BYTES // len(WORDS) + 2))[: OFFLOAD_BYTES + 10]
    req = chat([{"role": "system", "content": "be brief"}, {"role": "user", "content": text}])
    assert req.size >= OFFLOAD_BYTES
    cache = LRU(100)
    pending = EstimateCounter(cache).count_now(req, ())
    assert isinstance(pending, Later)  # counted in a worker thread
    counted = asyncio.run(_await(pending))
    assert counted == TokenCount(estimate_request(req), "estimate")
    assert len(cache) == 4  # two role markers, two contents: stored by the loop
    small = chat([{"role": "user", "content": "hi"}])
    assert isinstance(EstimateCounter(cache).count_now(small, ()), TokenCount)


async def _await(pending: Any) -> TokenCount:
    counted = await pending
    assert isinstance(counted, TokenCount)
    return counted
