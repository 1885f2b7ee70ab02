"""Forward: one upstream exchange, relayed to the client.

Streaming responses are relayed event by event as they arrive (never
re-buffered) with `Cache-Control: no-cache` and `X-Accel-Buffering: no`;
non-streaming bodies pass through byte for byte. `usage` is captured for
accounting in both cases. Timeouts: connect, first byte (streaming: until
the first body chunk; a long prefill needs a long bound), and the idle gap
between chunks; the overall deadline is enforced by the pipeline around
this call. Leaving this function by any path (error, cancellation) closes
the upstream connection unless the body was fully read: that is the abort
primitive for both vLLM and llama.cpp.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any, TypeVar

from gateway.config.schema import GatewayConfig, TimeoutsConfig
from gateway.deadlines.deadline import upstream_deadline_header
from gateway.engines import GENERIC
from gateway.errors import UpstreamNeverReached, UpstreamTimeout
from gateway.forward import rawbody
from gateway.forward.reassemble import StreamAssembler
from gateway.forward.sse import SSERelay, usage_from_body
from gateway.forward.upstream import UpstreamClient, UpstreamResponse
from gateway.replicas.registry import Replica
from gateway.request.context import Exchange, RequestContext, Usage
from gateway.request.timer import phase

Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
T = TypeVar("T")

PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
FORWARDED_CLIENT_HEADERS = ("accept", "user-agent", "traceparent", "tracestate", "baggage")
SSE_HEADERS = [(b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]


def _stream_upstream(replica: Replica, engine_default: bool) -> bool:
    mode = replica.config.upstream_streaming
    return engine_default if mode == "auto" else mode == "always"


def _first_byte(ctx: RequestContext, exchange: Exchange, prefill_done: bool = True) -> None:
    """The first response byte arrived. `prefill_done=False` when the whole
    answer arrived at once: what admission would release early (the lease's
    prefill claim) is released with the lease."""
    exchange.first_byte_at = time.monotonic()
    hook = ctx.admission.on_first_byte
    if prefill_done and hook is not None:
        hook()


async def _timed(ctx: RequestContext, aw: Awaitable[T], seconds: float, what: str) -> T:
    """`aw` bounded by `seconds` on the request's one timer (`gateway.request.timer`);
    its own timer when the request has none (a forward outside the pipeline)."""
    timer = ctx.deadline.timer if ctx.deadline is not None else None
    try:
        if timer is not None:
            return await phase(timer, aw, seconds, what)
        async with asyncio.timeout(seconds):
            return await aw
    except TimeoutError:
        raise UpstreamTimeout(f"The engine sent no {what} within {seconds:g} s.") from None


class Forwarder:
    def __init__(self, cfg: GatewayConfig, client: UpstreamClient) -> None:
        self._cfg = cfg
        self._client = client

    def upstream_headers(self, ctx: RequestContext, replica: Replica) -> dict[str, str]:
        headers = {
            "Content-Type": "application/json",
            "Accept-Encoding": "identity",
            "X-Request-Id": ctx.request_id,
        }
        if ctx.deadline is not None:
            headers["X-Request-Deadline"] = upstream_deadline_header(ctx)
        for name in FORWARDED_CLIENT_HEADERS:
            value = ctx.headers.get(name)
            if value is not None:
                headers[name] = value
        headers.update(replica.auth_headers())
        return headers

    def upstream_body(
        self, ctx: RequestContext, upstream_stream: bool = False
    ) -> tuple[bytes, bool]:
        """The body to send, and whether the gateway added `include_usage` itself.

        The one place the client's body is changed: the stages' typed edits
        (forwarded model, cache isolation, pinned slot, output limit) are
        applied to a copy, then spliced into the client's bytes when only keys
        were added (`rawbody.spliced`)."""
        req = ctx.request
        assert req is not None
        body = dict(req.body)
        injected = False
        if upstream_stream and not req.stream:
            body["stream"] = True
        if (req.stream or upstream_stream) and not req.client_wants_usage:
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
            injected = True
        _apply_records(ctx, body)
        data = rawbody.spliced(req.raw, req.original, body)
        return (rawbody.encode(body) if data is None else data), injected

    def _timeouts(self, ctx: RequestContext) -> TimeoutsConfig:
        return ctx.deadline.timeouts if ctx.deadline is not None else self._cfg.timeouts

    async def forward(self, ctx: RequestContext, replica: Replica, send: Send) -> None:
        """One exchange (`ctx.exchange`); an exchange that provably never
        reached the engine is forgotten, so a retry starts from a clean slate."""
        exchange = ctx.exchange = Exchange(sent_at=time.monotonic())
        try:
            await self._exchange(ctx, exchange, replica, send)
        except UpstreamNeverReached:
            ctx.exchange = None
            raise

    async def _exchange(
        self, ctx: RequestContext, exchange: Exchange, replica: Replica, send: Send
    ) -> None:
        req = ctx.request
        assert req is not None
        adapter = replica.engine
        reassemble = not req.stream and _stream_upstream(replica, adapter.stream_upstream)
        upstream_stream = req.stream or reassemble
        data, injected = self.upstream_body(ctx, upstream_stream)
        url = replica.url + PATHS[req.endpoint]
        timeouts = self._timeouts(ctx)
        reuse = adapter.reuse_after_stream or not upstream_stream
        post = self._client.post(
            url, self.upstream_headers(ctx, replica), data, timeouts.connect_s, reuse, replica.name
        )
        head_timeout = timeouts.first_byte_s if upstream_stream else timeouts.total_s
        async with contextlib.AsyncExitStack() as stack:
            # The head timeout bounds only the entry (a failed or cancelled
            # entry frees its connection itself).
            resp = await _timed(
                ctx, stack.enter_async_context(post), head_timeout, "response headers"
            )
            exchange.status = resp.status
            if resp.status != 200:
                await self._raise_engine_error(ctx, replica, resp)
            if reassemble:
                await self._reassemble(ctx, exchange, replica, resp, send)
            elif req.stream:
                await self._relay_stream(ctx, exchange, resp, send, injected)
            else:
                await self._relay_body(ctx, exchange, resp, send)

    async def _raise_engine_error(
        self, ctx: RequestContext, replica: Replica, resp: UpstreamResponse
    ) -> None:
        raw = await _timed(ctx, resp.read_all(), self._timeouts(ctx).idle_s, "error body")
        err = replica.engine.normalize_error(resp.status, raw)
        if resp.status == 503:
            # The engine refused before starting (busy, loading): provably not started.
            retry = UpstreamNeverReached(
                err.message, status=503, code=err.code or "engine_unavailable"
            )
            retry.type = err.type
            raise retry
        raise err

    def _start_message(
        self,
        ctx: RequestContext,
        content_type: str,
        extra: list[tuple[bytes, bytes]],
        length: int | None = None,
    ) -> dict[str, Any]:
        headers = [(b"content-type", content_type.encode("latin-1")), *extra]
        if length is not None:
            headers.append((b"content-length", b"%d" % length))
        headers += self.response_headers(ctx)
        return {"type": "http.response.start", "status": 200, "headers": headers}

    def response_headers(self, ctx: RequestContext) -> list[tuple[bytes, bytes]]:
        """The gateway's own response headers (request id, queue and overhead
        times, the contract the policy stage set)."""
        headers = [(b"x-request-id", ctx.request_id.encode("latin-1"))]
        if self._cfg.expose_replica_header and ctx.replica is not None:
            headers.append((b"x-gateway-replica", ctx.replica.name.encode("latin-1")))
        queue_ms = ctx.queue_seconds * 1000
        sent_at = ctx.exchange.sent_at if ctx.exchange is not None else time.monotonic()
        overhead_ms = max(0.0, (sent_at - ctx.received_at) * 1000 - queue_ms)
        headers.append((b"x-gateway-queue-ms", b"%.1f" % queue_ms))
        headers.append((b"x-gateway-overhead-ms", b"%.2f" % overhead_ms))
        for name, value in ctx.gateway_headers():
            headers.append((name.encode("latin-1"), value.encode("latin-1")))
        return headers

    async def _relay_stream(
        self,
        ctx: RequestContext,
        exchange: Exchange,
        resp: UpstreamResponse,
        send: Send,
        injected: bool,
    ) -> None:
        timeouts = self._timeouts(ctx)
        relay = SSERelay(drop_usage_only_chunk=injected)
        chunk = await _timed(ctx, resp.read_chunk(), timeouts.first_byte_s, "first token")
        _first_byte(ctx, exchange)
        await send(self._start_message(ctx, resp.content_type, SSE_HEADERS))
        exchange.phase = "streaming"
        try:
            while chunk:
                out = relay.feed(chunk)
                if out:
                    await send({"type": "http.response.body", "body": out, "more_body": True})
                chunk = await _timed(ctx, resp.read_chunk(), timeouts.idle_s, "data (idle gap)")
            tail = relay.flush()
        finally:
            exchange.usage = _usage(relay.usage, ctx.replica)
        await send({"type": "http.response.body", "body": tail, "more_body": False})

    async def _reassemble(
        self,
        ctx: RequestContext,
        exchange: Exchange,
        replica: Replica,
        resp: UpstreamResponse,
        send: Send,
    ) -> None:
        """Non-streaming answer rebuilt from an upstream stream (see gateway.forward.reassemble)."""
        timeouts = self._timeouts(ctx)
        assert ctx.request is not None
        assembler = StreamAssembler(ctx.request.endpoint)
        chunk = await _timed(ctx, resp.read_chunk(), timeouts.first_byte_s, "first token")
        _first_byte(ctx, exchange)
        exchange.phase = "streaming"
        while chunk:
            assembler.feed(chunk)
            chunk = await _timed(ctx, resp.read_chunk(), timeouts.idle_s, "data (idle gap)")
        exchange.usage = _usage(assembler.usage, replica)
        if assembler.error is not None:
            body = json.dumps({"error": assembler.error}).encode()
            status = assembler.error.get("code")
            raise replica.engine.normalize_error(status if isinstance(status, int) else 500, body)
        body = json.dumps(assembler.body(), ensure_ascii=False, separators=(",", ":")).encode()
        await send(self._start_message(ctx, "application/json", [], len(body)))
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async def _relay_body(
        self, ctx: RequestContext, exchange: Exchange, resp: UpstreamResponse, send: Send
    ) -> None:
        body = resp.complete_body()  # a small body often arrives with the head
        if body is None:
            body = await _timed(
                ctx, resp.read_all(1 << 30), self._timeouts(ctx).idle_s, "body (idle gap)"
            )
        _first_byte(ctx, exchange, prefill_done=False)
        exchange.usage = _usage(usage_from_body(body), ctx.replica)
        await send(self._start_message(ctx, resp.content_type, [], len(body)))
        await send({"type": "http.response.body", "body": body, "more_body": False})


def _apply_records(ctx: RequestContext, body: dict[str, Any]) -> None:
    """The contract's and the routing's edits of the upstream body."""
    contract, routing = ctx.contract, ctx.routing
    if contract is not None and contract.model is not None:
        body["model"] = contract.model
    if contract is not None and contract.isolation is not None:
        body.pop("cache_salt", None)
        if contract.isolation.salt is not None:
            body["cache_salt"] = contract.isolation.salt
    if routing.pinned_field is not None and routing.pinned_slot is not None:
        body[routing.pinned_field] = routing.pinned_slot
    if ctx.output_limit is not None:
        (ctx.replica.engine if ctx.replica else GENERIC).set_output_limit(body, ctx.output_limit)


def _usage(raw: Mapping[str, Any] | None, replica: Replica | None) -> Usage | None:
    """The engine's `usage` as counts; its cache hits as its adapter reads them."""
    if raw is None:
        return None
    engine = replica.engine if replica is not None else GENERIC
    return Usage.of(raw, engine.cached_tokens(raw))
