"""Ingress: parse the body, pick the session key, read the deadline headers (`ctx.parsed`).

A body from `OFFLOAD_BYTES` on is parsed in a worker thread, so that one
huge body does not hold the event loop (and every other request, health
probes included) for the length of `json.loads` and the checks after it
(~1 s for a 32 MiB body of tiny messages). The decoder's Python
`object_pairs_hook` runs once per JSON object, so the worker gives the GIL
back to the loop at least every switch interval (5 ms) on bodies of many
objects; a body of one huge string is decoded by one C call that holds the
GIL (~40-120 ms for 30 MB on a busy 2-core machine). One large body is parsed
at a time: with several worker threads in such calls at once, the GIL can pass
from one to the next while the loop waits (measured: /healthz stalls of
0.3-1.5 s with four 30 MB bodies in four threads).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from gateway.config.schema import GatewayConfig
from gateway.deadlines.client import parse_headers
from gateway.ingress.protocol import parse_request
from gateway.request.context import Parsed, RequestContext
from gateway.request.parsed import Endpoint, ParsedRequest

# Defaults of `sessions.headers` / `sessions.body_fields` (gateway.config.SessionsConfig).
SESSION_HEADERS = ("x-session-id", "session_id", "x-session-affinity")
SESSION_BODY_FIELDS = ("prompt_cache_key", "user")

#: Parsing a 1 MiB body on the loop costs ~1 ms (one string) to ~40 ms (tiny
#: messages); below it an agent request (~400 KB) is parsed where it is used,
#: without a thread hand-off and its GIL contention (bench/overhead.py:
#: ~25 % less CPU per agent request than a 256 KiB threshold).
OFFLOAD_BYTES = 1024 * 1024


class Ingress:
    def __init__(self, cfg: GatewayConfig) -> None:
        self._cfg = cfg
        self._parsing = asyncio.Semaphore(1)

    def process(self, ctx: RequestContext, raw: bytes) -> Awaitable[None] | None:
        """Parse and set `ctx.parsed`; None when done, or (a large body) an
        awaitable that parses in a worker thread."""
        endpoint: Endpoint = "chat" if ctx.endpoint == "chat" else "completions"
        if len(raw) >= OFFLOAD_BYTES:
            return self._process_off_loop(ctx, endpoint, raw)
        self._finish(ctx, parse_request(endpoint, raw, self._cfg.limits))
        return None

    async def _process_off_loop(self, ctx: RequestContext, endpoint: Endpoint, raw: bytes) -> None:
        async with self._parsing:
            request = await asyncio.to_thread(parse_request, endpoint, raw, self._cfg.limits)
        self._finish(ctx, request)

    def _finish(self, ctx: RequestContext, request: ParsedRequest) -> None:
        ctx.parsed = Parsed(
            request, self._session_key(ctx, request), parse_headers(ctx.headers, ctx.received_at)
        )

    def _session_key(self, ctx: RequestContext, request: ParsedRequest) -> str | None:
        for name in self._cfg.sessions.headers:
            value = ctx.headers.get(name)
            if value:
                return value[:256]
        for name in self._cfg.sessions.body_fields:
            value = request.body.get(name)
            if isinstance(value, str) and value:
                return value[:256]
        return None
