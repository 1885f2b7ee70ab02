"""Huge bodies refused before parsing, by their size against the input limit
of every task they may resolve to; bodies of too many objects refused while
decoding; the heap trimmed after large bodies."""

from __future__ import annotations

import asyncio
import json

import pytest

from gateway.config.schema import GatewayConfig, LimitsConfig
from gateway.errors import BadRequest, ContextLengthExceeded
from gateway.ingress import bodybound
from gateway.ingress.bodybound import HeapTrimmer, check_body
from gateway.ingress.protocol import max_objects, parse_request
from gateway.policies.policyset import LimitsSpec, MatchSpec, Policy, build_policy_set

CFG = GatewayConfig()
POLICIES = build_policy_set(
    [
        Policy(name="default", limits=LimitsSpec(max_input_tokens=1000)),
        Policy(name="small", limits=LimitsSpec(max_input_tokens=10)),
        Policy(
            name="agent",
            match=MatchSpec(models=("agent-coder",)),
            model="real",
            limits=LimitsSpec(max_input_tokens=100_000),
        ),
        Policy(name="open"),  # no input limit
    ]
)
#: what the default task's 1000 tokens could need, JSON structure included
DEFAULT_BOUND = 1000 * 512 + 64 * (10_000 + 50_000) + 1024 * 1024


def body(text: str, model: str = "m") -> bytes:
    return json.dumps({"model": model, "messages": [{"role": "user", "content": text}]}).encode()


def check(raw: bytes, **headers: str) -> None:
    check_body(CFG, POLICIES, headers, None, raw, "chat")


def test_a_body_over_the_default_tasks_bound_is_refused_before_parsing() -> None:
    raw = body("x" * (DEFAULT_BOUND + 10))
    with pytest.raises(ContextLengthExceeded) as exc:
        check(raw)
    assert exc.value.param == "messages"
    assert "task 'default' (1000 tokens, at most 512 bytes each)" in exc.value.message
    check(body("x" * (DEFAULT_BOUND - 200)))  # within: parsed and counted as usual


def test_the_x_task_header_names_the_bound() -> None:
    raw = body("x" * (DEFAULT_BOUND + 10))
    check(raw, **{"x-task": "agent"})  # 100,000 tokens could take it
    check(raw, **{"x-task": "open"})  # no limit: nothing to refuse by
    check(raw, **{"x-task": "nope"})  # unknown: the policy stage answers
    with pytest.raises(ContextLengthExceeded):
        check(body("x" * (64 * 60_000 + 1024 * 1024 + 5200)), **{"x-task": "small"})


def test_a_model_alias_the_body_may_name_lifts_the_bound() -> None:
    size = DEFAULT_BOUND + 10
    check(body("x" * size, model="agent-coder"))  # plainly named
    # a \\u escape could spell it: not refused on size
    check(body("\u00e9" + "x" * size))
    # quoted inside the text, its quotes are escaped: it cannot be the model
    with pytest.raises(ContextLengthExceeded):
        check(body('"agent-coder"' + "x" * size))
    check(body("x" * size) + b' "agent-coder"')  # any plain occurrence may be the model


def test_escapes_count_at_their_fewest_text_bytes() -> None:
    # 6 bytes of JSON per character: the text may be a sixth of the body
    raw = json.dumps({"messages": [{"role": "user", "content": "\x01" * (DEFAULT_BOUND // 3)}]})
    assert len(raw) > DEFAULT_BOUND
    check(raw.encode(), **{"x-task": "default"})


def test_the_scans_go_window_by_window_and_find_across_edges() -> None:
    w = bodybound.WINDOW
    raw = b"a" * (w - 2) + b'"m"' + b"\\" * 3 + b"b" * w
    assert bodybound._contains(raw, b'"m"')
    assert bodybound._count(raw, b"\\") == 3
    assert bodybound._count(b"\\" * (2 * w + 5), b"\\") == 2 * w + 5


def test_a_body_of_too_many_objects_stops_decoding() -> None:
    limits = LimitsConfig(max_messages=10, max_content_parts=10)
    cap = max_objects(limits)
    raw = json.dumps({"messages": [{"role": "user", "content": "hi"}] * (cap + 1)}).encode()
    with pytest.raises(BadRequest) as exc:
        parse_request("chat", raw, limits)
    assert exc.value.code == "array_above_max_length"
    assert f"more than {cap} JSON objects" in exc.value.message
    with pytest.raises(BadRequest) as exc:  # under the object cap: the message count says
        parse_request("chat", json.dumps({"messages": [{"role": "u"}] * 11}).encode(), limits)
    assert exc.value.param == "messages"


def test_the_heap_is_trimmed_after_large_bodies_for_a_while_then_not() -> None:
    async def scenario() -> int:
        trimmer = HeapTrimmer(delay_s=0.02, for_s=0.1)
        assert trimmer.available  # glibc (the CI image)
        trimmer.soon()
        trimmer.soon()  # coalesced
        await asyncio.sleep(0.3)
        done = trimmer.trims
        await asyncio.sleep(0.1)
        assert trimmer.trims == done  # stopped after `for_s`
        trimmer.close()
        return done

    trims = asyncio.run(scenario())
    assert 2 <= trims <= 8
