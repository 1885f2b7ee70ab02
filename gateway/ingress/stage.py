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

In the same worker, before parsing, a body whose task's input limit cannot
take it is refused by its size (`gateway.ingress.bodybound`); after large
bodies the heap is trimmed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from gateway.config.schema import GatewayConfig
from gateway.deadlines.client import parse_headers
from gateway.ingress.bodybound import HeapTrimmer, check_body
from gateway.ingress.protocol import parse_request
from gateway.policies.policyset import PolicySet
from gateway.request.context import Parsed, RequestContext
from gateway.request.later import Later, Step
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
    def __init__(self, cfg: GatewayConfig, policies: Callable[[], PolicySet] | None = None) -> None:
        self._cfg = cfg
        self._policies = policies
        self._parsing = asyncio.Semaphore(1)
        self.trimmer = HeapTrimmer()

    def process(self, ctx: RequestContext, raw: bytes) -> Step:
        """Parse and set `ctx.parsed`; None when done, or (a large body) a
        `Later` that checks and parses it in a worker thread."""
        endpoint: Endpoint = "chat" if ctx.endpoint == "chat" else "completions"
        if len(raw) >= OFFLOAD_BYTES:
            self.trimmer.soon()
            return Later(self._process_off_loop(ctx, endpoint, raw))
        self._finish(ctx, parse_request(endpoint, raw, self._cfg.limits))
        return None

    async def _process_off_loop(self, ctx: RequestContext, endpoint: Endpoint, raw: bytes) -> None:
        check = None
        if self._policies is not None:
            tenant = self._cfg.auth.tenants.get(ctx.tenant) if ctx.tenant else None
            default_task = tenant.default_task if tenant is not None else None
            check = (self._policies(), ctx.headers, default_task)
        async with self._parsing:
            request = await asyncio.to_thread(self._check_and_parse, endpoint, raw, check)
        self._finish(ctx, request)

    def _check_and_parse(
        self,
        endpoint: Endpoint,
        raw: bytes,
        check: tuple[PolicySet, Mapping[str, str], str | None] | None,
    ) -> ParsedRequest:
        """In the worker thread: refuse what the task's input limit cannot take, then parse."""
        if check is not None:
            check_body(self._cfg, *check, raw, endpoint)
        return parse_request(endpoint, raw, self._cfg.limits)

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
