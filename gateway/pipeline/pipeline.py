"""One request, one pass: ingress → policy → route → admit → forward → settle.

`Pipeline.handle` always answers the client (success, OpenAI-shaped error,
or an SSE error event once a stream has started) unless the client is gone,
in which case the ASGI endpoint cancels it; every resource is released by
the `async with` blocks below on every path.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

from gateway.deadlines import deadline as deadlines
from gateway.admission.controller import AdmissionController
from gateway.ingress.auth import Authenticator
from gateway.policy.budgets import Budgets
from gateway.config.schema import GatewayConfig
from gateway.pipeline.context import RequestContext
from gateway.errors import (
    DeadlineExceeded,
    GatewayError,
    NoHealthyReplica,
    UpstreamNeverReached,
    error_body,
    error_headers,
    sse_error_event,
)
from gateway.ingress.stage import Ingress
from gateway.observability.metrics import GatewayMetrics
from gateway.policy.stage import PolicyStage
from gateway.forward.forwarder import Forwarder, Send
from gateway.replicas.registry import Replica, ReplicaRegistry
from gateway.scheduling.router import Router

log = logging.getLogger("gateway.access")


@dataclass(slots=True)
class Stages:
    ingress: Ingress
    auth: Authenticator
    policy: PolicyStage
    budgets: Budgets
    router: Router
    admission: AdmissionController
    forwarder: Forwarder


class Pipeline:
    def __init__(self, cfg: GatewayConfig, registry: ReplicaRegistry, stages: Stages,
                 metrics: GatewayMetrics) -> None:
        self._cfg = cfg
        self._registry = registry
        self.stages = stages
        self._metrics = metrics

    async def handle(self, ctx: RequestContext, raw: bytes, send: Send) -> None:
        self._metrics.admitted.inc()
        self._metrics.in_flight.inc()
        try:
            failure = await self._outcome(ctx, raw, send)
            if failure is not None:
                await self._fail(ctx, failure, send)
        finally:
            self._metrics.in_flight.dec()
            self._settle(ctx)

    async def _outcome(self, ctx: RequestContext, raw: bytes, send: Send) -> GatewayError | None:
        """Run the request; sets `ctx.outcome` and returns the error still to be
        answered. (The answer is sent by the caller: the compiled build must not
        `await` inside an exception handler, see setup.py.)"""
        try:
            await self._run(ctx, raw, send)
        except GatewayError as err:
            ctx.outcome = err.reason
            if isinstance(err, DeadlineExceeded):
                self._metrics.deadline_exceeded.labels(ctx.stage).inc()
            return err
        except asyncio.CancelledError:
            ctx.outcome = "cancelled"
            self._metrics.cancellations.labels(ctx.stage).inc()
            raise
        except OSError:
            # The client went away while we were sending (ASGI 2.4 send raises).
            ctx.outcome = "cancelled"
            self._metrics.cancellations.labels(ctx.stage).inc()
            return None
        ctx.outcome = "ok"
        return None

    async def _run(self, ctx: RequestContext, raw: bytes, send: Send) -> None:
        s = self.stages
        s.auth.authenticate(ctx)
        s.ingress.process(ctx, raw)
        counting = s.policy.apply(ctx)
        if counting is not None:
            await counting
        deadlines.resolve(ctx, self._cfg)
        async with deadlines.enforce(ctx, send) as timed_send, s.budgets.reserve(ctx):
            await self._dispatch(ctx, timed_send)

    async def _dispatch(self, ctx: RequestContext, send: Send) -> None:
        tried: set[str] = set()
        last: GatewayError | None = None
        for _ in range(1 + self._cfg.limits.max_retries):
            candidates = [r for r in self._registry.healthy() if r.name not in tried]
            if not candidates:
                break
            retryable = await self._try_once(ctx, candidates, send, tried)
            if retryable is None:
                return
            last = retryable
        if last is not None:
            raise last
        raise NoHealthyReplica("No healthy replica is available.", retry_after=self._cfg.health.interval_s)

    async def _try_once(self, ctx: RequestContext, candidates: list[Replica], send: Send,
                        tried: set[str]) -> UpstreamNeverReached | None:
        """One attempt: route, admit, forward. Returns None when answered, or the
        retryable error when the replica was never reached (added to `tried`
        unless the same replica may be retried)."""
        s = self.stages
        ctx.stage = "routing"
        ranked = s.router.rank(ctx, candidates)
        ctx.stage = "queued"
        retryable: UpstreamNeverReached | None = None
        async with s.admission.acquire(ctx, ranked) as lease:
            ctx.replica = lease.replica
            ctx.attempts += 1
            s.router.on_routed(ctx, lease.replica)
            try:
                await s.forwarder.forward(ctx, lease.replica, send)
            except UpstreamNeverReached as err:
                self._attempt(lease.replica, "never_reached")
                if not err.retry_same_replica:
                    tried.add(lease.replica.name)
                retryable = err
            except GatewayError:
                self._attempt(lease.replica, "error")
                raise
            else:
                self._attempt(lease.replica, "ok")
        return retryable

    def _attempt(self, replica: Replica, result: str) -> None:
        self._metrics.attempts_by(replica.name, result).inc()

    async def _fail(self, ctx: RequestContext, err: GatewayError, send: Send) -> None:
        if ctx.response_started:
            if ctx.response_complete or not (ctx.request and ctx.request.stream):
                # A non-streaming body with its Content-Length is under way or done:
                # nothing more can be said; the connection closes with the task.
                return
            await _send_quietly(send, {"type": "http.response.body",
                                       "body": sse_error_event(err) + b"data: [DONE]\n\n",
                                       "more_body": False})
            return
        body = json.dumps(error_body(err)).encode()
        headers = {**error_headers(err, ctx.request_id), **ctx.response_headers}
        raw_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        raw_headers += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        ctx.response_started = True
        await _send_quietly(send, {"type": "http.response.start", "status": err.status, "headers": raw_headers})
        await _send_quietly(send, {"type": "http.response.body", "body": body, "more_body": False})

    def _settle(self, ctx: RequestContext) -> None:
        ctx.finished_at = time.monotonic()
        elapsed = ctx.finished_at - ctx.received_at
        m = self._metrics
        m.requests_by(ctx.task, ctx.outcome).inc()
        m.duration_by(ctx.task, ctx.outcome).observe(elapsed)
        if ctx.first_byte_at is not None:
            m.ttfb_by(ctx.task).observe(ctx.first_byte_at - ctx.received_at)
        if self._cfg.access_log:
            _access_log(ctx, elapsed)


def _access_log(ctx: RequestContext, elapsed: float) -> None:
    """One line per finished request (config `access_log`); never the body."""
    if log.isEnabledFor(logging.INFO):
        log.info(
            "request id=%s task=%s tenant=%s replica=%s outcome=%s status=%s attempts=%d stage=%s "
            "ms=%.1f usage=%s",
            ctx.request_id, ctx.task, ctx.tenant, ctx.replica.name if ctx.replica else None,
            ctx.outcome, ctx.upstream_status, ctx.attempts, ctx.stage, elapsed * 1000,
            _usage_brief(ctx.usage),
        )


def _usage_brief(usage: dict[str, Any] | None) -> str:
    if not usage:
        return "-"
    return f"{usage.get('prompt_tokens')}/{usage.get('completion_tokens')}"


async def _send_quietly(send: Send, message: MutableMapping[str, Any]) -> None:
    try:
        await send(message)
    except OSError:
        pass
