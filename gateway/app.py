"""`create_app(config)`: the gateway's public and admin ASGI apps.

No globals: everything a request needs hangs off the `Gateway` object built
here. The public app's lifespan owns the shared services (upstream client,
health monitor); the admin app only reads them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import re
import secrets
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.admin import build_admin_app
from gateway.admission import AdmissionController
from gateway.admission_metrics import AdmissionMetrics
from gateway.auth import Authenticator
from gateway.budgets import Budgets
from gateway.config import GatewayConfig
from gateway.context import RequestContext, header_map
from gateway.errors import GatewayError, NotFound, PayloadTooLarge, error_response
from gateway.httpserver_exchange import DISCONNECT_EXTENSION
from gateway.ingress import Ingress
from gateway.metrics import GatewayMetrics
from gateway.pipeline import Pipeline, Stages
from gateway.policy import PolicyStage
from gateway.poller import LiveStatePoller
from gateway.proxy import Forwarder
from gateway.replicas import HealthMonitor, ReplicaRegistry
from gateway.scheduling.router import build_router
from gateway.state import MemoryStateStore
from gateway.upstream import UpstreamClient

log = logging.getLogger("gateway")

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


class ClientGone(Exception):
    """The client disconnected before its body was read."""


class Gateway:
    def __init__(self, cfg: GatewayConfig) -> None:
        self.config = cfg
        self.metrics = GatewayMetrics()
        self.registry = ReplicaRegistry(cfg.replicas)
        self.client = UpstreamClient(cfg.upstream)
        self.health = HealthMonitor(self.registry, self.client, cfg.health)
        self.store = MemoryStateStore()
        self.policy = PolicyStage(cfg, self.registry, self.client, self.metrics.registry)
        self.admission = AdmissionController(cfg.admission, self.registry, self.store,
                                             AdmissionMetrics(self.metrics.registry))
        self.poller = LiveStatePoller(self.registry, self.client, cfg.admission, self.admission.trackers,
                                      self.admission.on_update)
        stages = Stages(
            ingress=Ingress(cfg),
            auth=Authenticator(cfg.auth),
            policy=self.policy,
            budgets=Budgets(cfg, self.store, metrics_registry=self.metrics.registry),
            router=build_router(cfg.scheduling, registry=self.metrics.registry,
                                can_admit=self.admission.can_admit),
            admission=self.admission,
            forwarder=Forwarder(cfg, self.client),
        )
        self.pipeline = Pipeline(cfg, self.registry, stages, self.metrics)
        # Request ids: a random 64-bit prefix per process + a counter (unique across
        # instances without a getrandom syscall and a UUID object per request).
        self._id_prefix = secrets.token_hex(8)
        self._id_counter = itertools.count(1)
        self.public_app = self._build_public_app()
        self.admin_app = build_admin_app(self)

    def new_request_id(self) -> str:
        return f"{self._id_prefix}{next(self._id_counter):08x}"

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        await self.client.start()
        try:
            await self.health.check_all()
            await self.health.start()
            await self.poller.poll_all()
            await self.poller.start()
            yield
        finally:
            await self.poller.stop()
            await self.health.stop()
            await self.client.close()

    def _build_public_app(self) -> PublicApp:
        routes = [
            Route("/v1/chat/completions", CompletionsEndpoint("chat", self), methods=["POST"]),
            Route("/v1/completions", CompletionsEndpoint("completions", self), methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/readyz", self.readyz, methods=["GET"]),
        ]
        handlers: dict[Any, Any] = {HTTPException: _http_exception}
        app = Starlette(routes=routes, lifespan=self.lifespan, exception_handlers=handlers)
        return PublicApp(app, {"/v1/chat/completions": routes[0].app, "/v1/completions": routes[1].app})

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": self.registry.models()})

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        healthy = len(self.registry.healthy())
        body = {"status": "ready" if healthy else "not_ready", "healthy_replicas": healthy,
                "replicas": len(self.registry)}
        return JSONResponse(body, status_code=200 if healthy else 503)


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 405:
        err: GatewayError = NotFound(f"Method {request.method} is not allowed on {request.url.path}.",
                                     status=405, code="method_not_allowed")
    else:
        err = NotFound(f"Unknown path: {request.method} {request.url.path}.", status=exc.status_code)
    return error_response(err)


class PublicApp:
    """The public ASGI app: completion POSTs go straight to their endpoint (the
    hot path skips Starlette's middleware and routing); everything else, and
    the lifespan, goes through the Starlette app."""

    def __init__(self, app: Starlette, fast: dict[str, ASGIApp]) -> None:
        self.app = app
        self._fast = fast

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            endpoint = self._fast.get(scope["path"])
            if endpoint is not None:
                await endpoint(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(cfg: GatewayConfig) -> Gateway:
    return Gateway(cfg)


class CompletionsEndpoint:
    """Raw ASGI endpoint: reads the body under a size limit, then races the
    pipeline against the client's `http.disconnect` (no polling)."""

    def __init__(self, endpoint: str, gateway: Gateway) -> None:
        self._endpoint = endpoint
        self._gw = gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = header_map(scope["headers"])
        rid = headers.get("x-request-id", "")
        ctx = RequestContext(
            request_id=rid if _REQUEST_ID.match(rid) else self._gw.new_request_id(),
            endpoint=self._endpoint,
            path=scope["path"],
            headers=headers,
            received_at=time.monotonic(),
            client_host=(scope.get("client") or (None,))[0],
        )
        try:
            raw = await _read_body(receive, headers, self._gw.config.limits.max_body_bytes)
        except PayloadTooLarge as err:
            await error_response(err, ctx.request_id)(scope, receive, send)
            return
        except ClientGone:
            self._gw.metrics.cancellations.labels("ingress").inc()
            return
        work = self._gw.pipeline.handle(ctx, raw, _TrackedSend(send, ctx))
        watch = scope.get("extensions", _NO_EXTENSIONS).get(DISCONNECT_EXTENSION) or _receive_watch(receive)
        await _race_disconnect(work, watch, ctx)


_NO_EXTENSIONS: Mapping[str, Any] = {}


class _TrackedSend:
    """The client's `send`, noting when the last body byte has gone out."""

    __slots__ = ("_ctx", "_send")

    def __init__(self, send: Send, ctx: RequestContext) -> None:
        self._send = send
        self._ctx = ctx

    async def __call__(self, message: Message) -> None:
        await self._send(message)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self._ctx.response_complete = True


async def _read_body(receive: Receive, headers: Mapping[str, str], limit: int) -> bytes:
    declared = headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"Request body of {declared} bytes exceeds the limit of {limit} bytes.")
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


async def _race_disconnect(work: Coroutine[Any, Any, None], watch: Watch, ctx: RequestContext) -> None:
    """Run the pipeline until it ends or the client goes away, whichever is first.

    The pipeline runs in this task; `watch(callback)` calls back once the
    client disconnects (the lean server's `DISCONNECT_EXTENSION`; on other
    servers `_receive_watch`, a task blocked in `receive()`), and the callback
    cancels this task. Once the last body byte was sent, a disconnect no
    longer cancels: the remaining work is settling (lease release, budget
    settle), which must complete."""
    current = asyncio.current_task()
    assert current is not None
    ctx.serving_task = current
    gone = False

    def on_disconnect() -> None:
        nonlocal gone
        if not ctx.response_complete and not gone:
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
