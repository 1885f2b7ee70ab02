"""`create_app(config)`: the gateway's public and admin ASGI apps.

No globals: everything a request needs hangs off the `Gateway` object built
here. The public app's lifespan owns the shared services (upstream client,
health monitor); the admin app only reads them.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import secrets
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.admin import build_admin_app
from gateway.admin.sessions import SessionTable
from gateway.admission.controller import AdmissionController
from gateway.admission.metrics import AdmissionMetrics
from gateway.config.schema import GatewayConfig
from gateway.config.state import StateConfig
from gateway.errors import GatewayError, NotFound, error_response, render_server_error
from gateway.forward.forwarder import Forwarder
from gateway.forward.upstream import UpstreamClient
from gateway.http.serving import Listener
from gateway.ingress.auth import Authenticator
from gateway.ingress.stage import Ingress
from gateway.observability.metrics import GatewayMetrics
from gateway.pipeline.endpoint import CompletionsEndpoint, PublicApp
from gateway.pipeline.pipeline import Pipeline, Stages
from gateway.policy.budgets import Budgets
from gateway.policy.stage import PolicyStage
from gateway.replicas.discovery import DnsDiscovery, Resolver, resolve_host
from gateway.replicas.poller import LiveStatePoller
from gateway.replicas.registry import HealthMonitor, Replica, ReplicaRegistry
from gateway.scheduling.affinity import SessionAffinity
from gateway.scheduling.router import Router, build_router
from gateway.state import MemoryStateStore, StateStore
from gateway.state.failover import FailoverStore

log = logging.getLogger("gateway")

#: how much longer than `listen.graceful_timeout_s` the public server keeps
#: connections open on shutdown, for the answers of the requests ended then
_ANSWER_MARGIN_S = 3.0


class Gateway:
    def __init__(self, cfg: GatewayConfig, *, resolver: Resolver = resolve_host) -> None:
        self.config = cfg
        self.metrics = GatewayMetrics()
        self.registry = ReplicaRegistry(cfg.replicas)
        self.discovery = DnsDiscovery(
            cfg.discovery,
            self.registry,
            resolver=resolver,
            on_failure=lambda e: self.metrics.discovery_failures.labels(e.name).inc(),
        )
        self.client = UpstreamClient(cfg.upstream)
        self.health = HealthMonitor(self.registry, self.client, cfg.health)
        self.store, self.failover = build_state_store(cfg.state, self.metrics)
        self.policy = PolicyStage(cfg, self.registry, self.client, self.metrics.registry)
        self.admission = AdmissionController(
            cfg.admission, self.registry, self.store, AdmissionMetrics(self.metrics.registry)
        )
        self.poller = LiveStatePoller(
            self.registry,
            self.client,
            cfg.admission,
            self.admission.trackers,
            self.admission.on_update,
        )
        stages = Stages(
            ingress=Ingress(cfg, lambda: self.policy.policies),
            auth=Authenticator(cfg.auth),
            policy=self.policy,
            budgets=Budgets(
                cfg,
                self.store,
                metrics_registry=self.metrics.registry,
                count_exactly=self.policy.count_exactly,
            ),
            router=build_router(
                cfg.scheduling, registry=self.metrics.registry, can_admit=self.admission.can_admit
            ),
            admission=self.admission,
            forwarder=Forwarder(cfg, self.client),
            affinity=(
                SessionAffinity(self.store, cfg.scheduling.index_ttl_s)
                if self.failover is not None
                else None
            ),
        )
        self.registry.subscribe(_ForgetLeft(stages.router, self.metrics))
        self.sessions = SessionTable(stages.budgets, stages.router, stages.affinity)
        self.pipeline = Pipeline(cfg, self.registry, stages, self.metrics)
        # Request ids: a random 64-bit prefix per process + a counter (unique across
        # instances without a getrandom syscall and a UUID object per request).
        self._id_prefix = secrets.token_hex(8)
        self._id_counter = itertools.count(1)
        self.public_app = self._build_public_app()
        self.admin_app = build_admin_app(self)

    def listeners(self) -> list[Listener]:
        """The public and admin listeners `config.listen` describes (the public
        one answers its own HTTP errors in the gateway's error shape)."""
        lc = self.config.listen
        return [
            Listener(
                self.public_app,
                lc.host,
                lc.port,
                server=lc.server,
                render_error=render_server_error,
                head_timeout=lc.head_timeout_s,
                body_timeout=lc.body_timeout_s,
                body_total_timeout=lc.body_total_timeout_s,
                keepalive_timeout=lc.keepalive_timeout_s,
                # the drain (`drain`) ends what still runs after its grace and
                # gives that time to answer: the server waits a little longer
                graceful_timeout=lc.graceful_timeout_s + _ANSWER_MARGIN_S,
            ),
            # `/metrics` stays scrapeable (and `/readyz` says 503) until the drain is done
            Listener(self.admin_app, lc.admin_host, lc.admin_port, stop_last=True),
        ]

    async def drain(self) -> None:
        """On SIGTERM/SIGINT (`gateway serve`): `/readyz` turns 503, new requests
        are refused, those in flight get `listen.graceful_timeout_s`, then what
        is left ends with a `shutting_down` error (gateway/pipeline/lifecycle.py)."""
        await self.pipeline.lifecycle.drain(self.config.listen.graceful_timeout_s)

    def new_request_id(self) -> str:
        return f"{self._id_prefix}{next(self._id_counter):08x}"

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        await self.client.start()
        try:
            if self.failover is not None:
                await self.failover.start()  # never raises: an outage is `on_failure`'s
            await self.discovery.refresh_all()
            await self.health.check_all()
            await self.health.start()
            await self.poller.poll_all()
            await self.poller.start()
            await self.discovery.start()
            yield
        finally:
            await self.discovery.stop()
            await self.poller.stop()
            await self.health.stop()
            await self.admission.close()
            try:
                await self.store.close()
            finally:
                await self.client.close()

    def _build_public_app(self) -> PublicApp:
        routes = [
            Route("/v1/chat/completions", self._endpoint("chat"), methods=["POST"]),
            Route("/v1/completions", self._endpoint("completions"), methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/readyz", self.readyz, methods=["GET"]),
        ]
        handlers: dict[Any, Any] = {HTTPException: _http_exception, Exception: _internal_error}
        app = Starlette(routes=routes, lifespan=self.lifespan, exception_handlers=handlers)
        # No 307 to the path without its trailing slash: the redirect's Location
        # would be built from the client's Host header. Unknown paths are 404s.
        app.router.redirect_slashes = False
        fast = {"/v1/chat/completions": routes[0].app, "/v1/completions": routes[1].app}
        return PublicApp(app, fast, self.new_request_id)

    def _endpoint(self, name: str) -> CompletionsEndpoint:
        return CompletionsEndpoint(
            name,
            self.pipeline,
            self.new_request_id,
            self.config.limits.max_body_bytes,
            self.metrics,
        )

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": self.registry.models()})

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        healthy = len(self.registry.healthy())
        failover = self.failover
        # Not ready while requests that need shared state would get 503 (on_failure: closed).
        draining = self.pipeline.lifecycle.draining
        ready = bool(healthy) and (failover is None or failover.ready) and not draining
        body = {
            "status": "shutting_down" if draining else ("ready" if ready else "not_ready"),
            "healthy_replicas": healthy,
            "replicas": len(self.registry),
            "state_store": "memory" if failover is None else ("up" if failover.up else "down"),
        }
        return JSONResponse(body, status_code=200 if ready else 503)


class _ForgetLeft:
    """A replica that left the set (DNS discovery): routing and the metrics
    drop what they kept of it."""

    def __init__(self, router: Router, metrics: GatewayMetrics) -> None:
        self._router = router
        self._metrics = metrics

    def replica_added(self, replica: Replica) -> None:
        return None

    def replica_removed(self, replica: Replica) -> None:
        self._router.forget_replica(replica.name)
        self._metrics.forget_replica(replica.name)


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 405:
        err: GatewayError = NotFound(
            f"Method {request.method} is not allowed on {request.url.path}.",
            status=405,
            code="method_not_allowed",
        )
    else:
        err = NotFound(
            f"Unknown path: {request.method} {request.url.path}.", status=exc.status_code
        )
    response = error_response(err)
    if exc.headers:  # a 405 names the methods the path allows (`Allow`)
        response.headers.update(exc.headers)
    return response


async def _internal_error(request: Request, exc: Exception) -> Response:
    # Starlette re-raises `exc` after this answer: the server logs it.
    return error_response(GatewayError("Internal server error"))


def build_state_store(
    cfg: StateConfig, metrics: GatewayMetrics
) -> tuple[StateStore, FailoverStore | None]:
    """The store `state` describes, and its failover wrapper when shared
    (the lifespan starts its probe and reads its readiness)."""
    if cfg.backend == "memory" or cfg.redis is None:
        return MemoryStateStore(), None
    # Imported here: the redis client is loaded only by gateways that use it.
    from gateway.state.redis import RedisStateStore

    rc = cfg.redis
    sentinel = rc.sentinel
    shared = RedisStateStore.from_settings(
        rc.url,
        sentinel_master=sentinel.master if sentinel else None,
        sentinel_nodes=sentinel.addresses if sentinel else None,
        cluster=rc.cluster,
        pool_size=rc.pool_size,
        connect_timeout_s=rc.connect_timeout_s,
        command_timeout_s=rc.command_timeout_s,
        key_prefix=cfg.key_prefix,
        lease_ttl_s=rc.lease_ttl_s,
    )
    store = FailoverStore(
        shared,
        MemoryStateStore(),
        on_failure=rc.on_failure,
        probe_interval_s=rc.probe_interval_s,
        # The Redis store bounds each call itself (socket timeouts, after a
        # connection slot is free: waiting for one is load, not an outage).
        call_timeout_s=None,
        metrics=metrics,
    )
    return store, store


def create_app(cfg: GatewayConfig, *, resolver: Resolver = resolve_host) -> Gateway:
    """`resolver`: how `discovery` names are resolved (tests pass a stub)."""
    return Gateway(cfg, resolver=resolver)
