"""The public completion endpoints as raw ASGI apps: the request's way in.

`PublicApp` sends completion POSTs straight to a `CompletionsEndpoint`
(skipping Starlette's routing and middleware); the endpoint reads the body
under the size limit, builds the `RequestContext`, and runs the pipeline
raced against the client's disconnect. Wired up by `gateway.app`.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from starlette.applications import Starlette
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import PayloadTooLarge, error_response
from gateway.http.exchange import DISCONNECT_EXTENSION
from gateway.observability.metrics import GatewayMetrics
from gateway.pipeline.pipeline import Pipeline
from gateway.request.context import RequestContext, header_map

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


class ClientGone(Exception):
    """The client disconnected before its body was read."""


class PublicApp:
    """The public ASGI app: completion POSTs go straight to their endpoint (the
    hot path skips Starlette's middleware and routing); everything else, and
    the lifespan, goes through the Starlette app. Every HTTP answer carries
    `x-request-id` (the client's, or a new one), 404s and 405s included."""

    def __init__(
        self, app: Starlette, fast: dict[str, ASGIApp], new_request_id: Callable[[], str]
    ) -> None:
        self.app = app
        self._fast = fast
        self._new_request_id = new_request_id

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["method"] == "POST":
            endpoint = self._fast.get(scope["path"])
            if endpoint is not None:
                await endpoint(scope, receive, send)
                return
        rid = header_map(scope["headers"]).get("x-request-id", "")
        rid = rid if _REQUEST_ID.match(rid) else self._new_request_id()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k != b"x-request-id"]
                headers.append((b"x-request-id", rid.encode("latin-1")))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_id)


class CompletionsEndpoint:
    """Raw ASGI endpoint: reads the body under a size limit, then races the
    pipeline against the client's `http.disconnect` (no polling)."""

    def __init__(
        self,
        endpoint: str,
        pipeline: Pipeline,
        new_request_id: Callable[[], str],
        max_body_bytes: int,
        metrics: GatewayMetrics,
    ) -> None:
        self._endpoint = endpoint
        self._pipeline = pipeline
        self._new_request_id = new_request_id
        self._max_body_bytes = max_body_bytes
        self._metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = header_map(scope["headers"])
        rid = headers.get("x-request-id", "")
        ctx = RequestContext(
            request_id=rid if _REQUEST_ID.match(rid) else self._new_request_id(),
            endpoint=self._endpoint,
            path=scope["path"],
            headers=headers,
            received_at=time.monotonic(),
            client_host=(scope.get("client") or (None,))[0],
        )
        too_large: PayloadTooLarge | None = None  # answered outside the handler (setup.py)
        try:
            raw = await _read_body(receive, headers, self._max_body_bytes)
        except PayloadTooLarge as err:
            too_large, raw = err.with_traceback(None), b""  # no frame ↔ traceback cycle
        except ClientGone:
            self._metrics.cancellations.labels("ingress").inc()
            return
        if too_large is not None:
            await error_response(too_large, ctx.request_id)(scope, receive, send)
            return
        work = self._pipeline.handle(ctx, raw, _TrackedSend(send, ctx))
        watch = scope.get("extensions", _NO_EXTENSIONS).get(DISCONNECT_EXTENSION) or _receive_watch(
            receive
        )
        await _race_disconnect(work, watch, ctx)


_NO_EXTENSIONS: Mapping[str, Any] = {}


class _TrackedSend:
    """The client's `send`, recording in `ctx.response` that the response has
    started (before the start message goes out: once it is attempted, no
    other start may follow) and that its last body byte has gone out."""

    __slots__ = ("_response", "_send")

    def __init__(self, send: Send, ctx: RequestContext) -> None:
        self._send = send
        self._response = ctx.response

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self._response.started = True
            await self._send(message)
            return
        await self._send(message)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self._response.complete = True


async def _read_body(receive: Receive, headers: Mapping[str, str], limit: int) -> bytes:
    declared = headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(
            f"Request body of {declared} bytes exceeds the limit of {limit} bytes."
        )
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"Request body exceeds the limit of {limit} bytes.")
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)


Watch = Callable[[Callable[[], None]], Callable[[], None]]


async def _race_disconnect(
    work: Coroutine[Any, Any, None], watch: Watch, ctx: RequestContext
) -> None:
    """Run the pipeline until it ends or the client goes away, whichever is first.

    The pipeline runs in this task; `watch(callback)` calls back once the
    client disconnects (the lean server's `DISCONNECT_EXTENSION`; on other
    servers `_receive_watch`, a task blocked in `receive()`), and the callback
    cancels this task. Once the last body byte was sent, a disconnect no
    longer cancels: the remaining work is giving back what the request took
    (`release.py`: lease, budget reservation) and its record, which must
    complete."""
    current = asyncio.current_task()
    assert current is not None
    ctx.serving_task = current
    gone = False

    def on_disconnect() -> None:
        nonlocal gone
        if not ctx.response.complete and not gone:
            gone = True
            current.cancel()

    unwatch = watch(on_disconnect)
    try:
        await work
    except asyncio.CancelledError:
        # Ours (the client left) is absorbed; anyone else's (shutdown) propagates.
        if not gone or current.uncancel() > 0:
            raise
    finally:
        unwatch()


def _receive_watch(receive: Receive) -> Watch:
    """A `Watch` for servers without the extension: a task waiting for `http.disconnect`."""

    def watch(callback: Callable[[], None]) -> Callable[[], None]:
        def done(watcher: asyncio.Future[None]) -> None:
            if not watcher.cancelled() and watcher.exception() is None:
                callback()

        watcher = asyncio.ensure_future(_wait_disconnect(receive))
        watcher.add_done_callback(done)

        def unwatch() -> None:
            watcher.remove_done_callback(done)
            watcher.cancel()

        return unwatch

    return watch


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
