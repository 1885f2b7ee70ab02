"""One request, one pass:

    auth → ingress → policy → deadlines → budgets → route → admit → forward → record

`Pipeline.handle` always answers the client (success, an OpenAI-shaped
error, or an SSE error event once a stream has started) unless the client
is gone, in which case the endpoint cancels it. What the request takes (its
timer, budget reservation, admission lease) is held and given back by
`release.py`, on every path; the upstream connection by the forwarder. The
record (metrics, access log) is made last (`record.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

from gateway.admission.controller import AdmissionController
from gateway.config.schema import GatewayConfig
from gateway.deadlines import deadline as deadlines
from gateway.errors import (
    DeadlineExceeded,
    GatewayError,
    NoHealthyReplica,
    UpstreamNeverReached,
    error_bytes,
    sse_error_event,
)
from gateway.forward.forwarder import Forwarder, Send
from gateway.ingress.auth import Authenticator
from gateway.ingress.stage import Ingress
from gateway.observability.metrics import GatewayMetrics
from gateway.pipeline import release
from gateway.pipeline.lifecycle import Lifecycle
from gateway.pipeline.record import Recorder
from gateway.policy.budgets import Budgets
from gateway.policy.stage import PolicyStage
from gateway.replicas.outliers import OutlierDetector, failed_exchange
from gateway.replicas.registry import Replica, ReplicaRegistry
from gateway.request.context import RequestContext
from gateway.scheduling.affinity import SessionAffinity
from gateway.scheduling.router import Router
from gateway.state.base import Rider

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Stages:
    ingress: Ingress
    auth: Authenticator
    policy: PolicyStage
    budgets: Budgets
    router: Router
    admission: AdmissionController
    forwarder: Forwarder
    #: session → replica through the shared state store (several instances), if any
    affinity: SessionAffinity | None = None


class Pipeline:
    def __init__(
        self, cfg: GatewayConfig, registry: ReplicaRegistry, stages: Stages, metrics: GatewayMetrics
    ) -> None:
        self._cfg = cfg
        self._registry = registry
        self.stages = stages
        self._metrics = metrics
        self._record = Recorder(metrics, cfg.access_log)
        self.lifecycle = Lifecycle()
        self._outliers = OutlierDetector(
            cfg.health, lambda r: metrics.replica_ejections.labels(r.name).inc()
        )

    async def handle(self, ctx: RequestContext, raw: bytes, send: Send) -> None:
        self._metrics.admitted.inc()
        self._metrics.in_flight.inc()
        self.lifecycle.enter(ctx)
        try:
            await self._answer(ctx, raw, send)
        finally:
            self.lifecycle.leave(ctx)
            self._metrics.in_flight.dec()
            self._record.record(ctx)

    async def _answer(self, ctx: RequestContext, raw: bytes, send: Send) -> None:
        """Run the request and answer it; sets `ctx.outcome` (`ctx.finish`)."""
        try:
            await self._run(ctx, raw, send)
        except GatewayError as err:
            ctx.finish("error", err.reason)
            if isinstance(err, DeadlineExceeded):
                self._metrics.deadline_exceeded.labels(ctx.stage).inc()
            await self._fail(ctx, err, send)
        except asyncio.CancelledError:
            ctx.finish("cancelled")
            self._metrics.cancellations.labels(ctx.stage).inc()
            raise
        except OSError:
            # The client went away while we were sending (ASGI 2.4 send raises).
            ctx.finish("cancelled")
            self._metrics.cancellations.labels(ctx.stage).inc()
        except Exception as exc:  # a bug: the client still gets an answer, the log the details
            await self._internal_error(ctx, exc, send)
        else:
            ctx.finish("ok")

    async def _internal_error(self, ctx: RequestContext, exc: BaseException, send: Send) -> None:
        log.error("request %s failed in stage %s", ctx.request_id, ctx.stage, exc_info=exc)
        ctx.finish("error", "internal_error")
        await self._fail(ctx, GatewayError("Internal error; the request may be retried."), send)

    async def _run(self, ctx: RequestContext, raw: bytes, send: Send) -> None:
        s = self.stages
        if self.lifecycle.draining:
            raise deadlines.shutting_down_error()
        s.auth.authenticate(ctx)
        parsing = s.ingress.process(ctx, raw)  # a large body: parsed in a worker thread
        if parsing is not None:
            await parsing
        counting = s.policy.apply(ctx)
        if counting is not None:
            await counting
        deadlines.resolve(ctx, self._cfg)
        if self.lifecycle.ended:  # admitted before the drain, but its grace is over
            raise deadlines.shutting_down_error()
        # The session map's read and write ride on the budget reservation.
        session_key = s.router.session_key(ctx) if s.affinity is not None else None
        rider = s.affinity.rider(session_key) if s.affinity is not None else None
        async with release.request(ctx, send, s.budgets, rider) as timed_send:
            await self._dispatch(ctx, timed_send, session_key, rider)

    async def _dispatch(
        self, ctx: RequestContext, send: Send, session_key: str | None, rider: Rider | None
    ) -> None:
        """Route, admit and forward; retry on another replica what provably
        never reached an engine."""
        tried: set[str] = set()
        last: UpstreamNeverReached | None = None
        for _ in range(1 + self._cfg.limits.max_retries):
            candidates = [r for r in self._registry.healthy() if r.name not in tried]
            if not candidates:
                break
            try:
                await self._attempt(ctx, candidates, send, session_key, rider)
                return
            except UpstreamNeverReached as err:
                if not err.retry_same_replica and ctx.replica is not None:
                    tried.add(ctx.replica.name)
                last = err
        if last is not None:
            raise last
        raise NoHealthyReplica(
            "No healthy replica is available.", retry_after=self._cfg.health.interval_s
        )

    async def _attempt(
        self,
        ctx: RequestContext,
        candidates: list[Replica],
        send: Send,
        session_key: str | None,
        rider: Rider | None,
    ) -> None:
        s = self.stages
        ctx.progress = "routing"
        if s.affinity is not None and ctx.attempts == 0:
            await s.affinity.lookup(ctx, session_key, rider)
        ranking = s.router.rank(ctx, candidates)
        ctx.progress = "queued"
        async with release.lease(s.admission, ctx, ranking.replicas) as lease:
            replica = ctx.replica = lease.replica
            ctx.attempts += 1
            s.router.on_routed(ctx, ranking, replica)
            if rider is not None and not rider.carried:
                rider.carried = lease.carry(rider.writes)  # the map's write, on its release
            if s.affinity is not None:
                await s.affinity.remember(ctx, session_key, replica.name, rider)
            try:
                await s.forwarder.forward(ctx, replica, send)
            except UpstreamNeverReached as err:
                self._count_attempt(replica, "never_reached")
                self._outliers.record(replica, failed_exchange(err))
                raise
            except GatewayError as err:
                self._count_attempt(replica, "error")
                self._outliers.record(replica, failed_exchange(err))
                raise
            self._count_attempt(replica, "ok")
            self._outliers.record(replica, False)
            s.router.on_answered(ctx, replica)

    def _count_attempt(self, replica: Replica, result: str) -> None:
        self._metrics.attempts_by(replica.name, result).inc()

    async def _fail(self, ctx: RequestContext, err: GatewayError, send: Send) -> None:
        if ctx.response.started:
            if ctx.response.complete or not (ctx.request and ctx.request.stream):
                # A non-streaming body with its Content-Length is under way or done:
                # nothing more can be said; the connection closes with the task.
                return
            await _send_quietly(
                send,
                {
                    "type": "http.response.body",
                    "body": sse_error_event(err) + b"data: [DONE]\n\n",
                    "more_body": False,
                },
            )
            return
        status, raw_headers, body = error_bytes(err, ctx.request_id, dict(ctx.gateway_headers()))
        await _send_quietly(
            send, {"type": "http.response.start", "status": status, "headers": raw_headers}
        )
        await _send_quietly(send, {"type": "http.response.body", "body": body, "more_body": False})


async def _send_quietly(send: Send, message: MutableMapping[str, Any]) -> None:
    with contextlib.suppress(OSError):
        await send(message)
