"""The stages' calling convention (gateway/request/later.py): a step finishes
inline, returning None, or says by its type that it must wait, returning a
`Later` (here: a large body parsed in a worker thread)."""

from __future__ import annotations

import asyncio
import json
import time

from gateway.config.schema import parse_config
from gateway.ingress.stage import OFFLOAD_BYTES, Ingress
from gateway.request.context import RequestContext
from gateway.request.later import Later

CFG = parse_config({"replicas": [{"url": "http://127.0.0.1:8000/"}]})


def _ctx() -> RequestContext:
    return RequestContext(
        request_id="r",
        endpoint="chat",
        path="/v1/chat/completions",
        headers={},
        received_at=time.monotonic(),
    )


def _body(chars: int) -> bytes:
    message = {"role": "user", "content": "x" * chars}
    return json.dumps({"model": "m", "messages": [message]}).encode()


def test_a_small_body_is_parsed_inline() -> None:
    ctx = _ctx()
    assert Ingress(CFG).process(ctx, _body(10)) is None
    assert ctx.parsed is not None and ctx.parsed.request.model == "m"


def test_a_large_body_is_a_later_that_parses_when_awaited() -> None:
    async def scenario() -> None:
        ctx = _ctx()
        step = Ingress(CFG).process(ctx, _body(OFFLOAD_BYTES))
        assert isinstance(step, Later)
        assert ctx.parsed is None  # nothing done until it is awaited
        await step
        assert ctx.parsed is not None and ctx.parsed.request.size >= OFFLOAD_BYTES

    asyncio.run(asyncio.wait_for(scenario(), 30))
