"""Settle: the last stage of every request, on every path.

Leases and budget reservations are given back by their own `async with`
blocks as the pipeline unwinds; what is left here is the record: the
request's metrics (count and duration by task and outcome, time to first
byte) and, when `access_log` is on, one access-log line (never the body).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from gateway.observability.metrics import GatewayMetrics
from gateway.pipeline.context import RequestContext

log = logging.getLogger("gateway.access")


class Settle:
    def __init__(self, metrics: GatewayMetrics, access_log: bool) -> None:
        self._metrics = metrics
        self._access_log = access_log

    def settle(self, ctx: RequestContext) -> None:
        ctx.finished_at = time.monotonic()
        elapsed = ctx.finished_at - ctx.received_at
        m = self._metrics
        m.requests_by(ctx.task, ctx.outcome).inc()
        m.duration_by(ctx.task, ctx.outcome).observe(elapsed)
        first_byte_at = ctx.first_byte_at
        if first_byte_at is not None:
            m.ttfb_by(ctx.task).observe(first_byte_at - ctx.received_at)
        if self._access_log and log.isEnabledFor(logging.INFO):
            _access_line(ctx, elapsed)


def _access_line(ctx: RequestContext, elapsed: float) -> None:
    log.info(
        "request id=%s task=%s tenant=%s replica=%s outcome=%s status=%s attempts=%d stage=%s "
        "ms=%.1f usage=%s",
        ctx.request_id,
        ctx.task,
        ctx.tenant,
        ctx.replica.name if ctx.replica else None,
        ctx.outcome,
        ctx.upstream_status,
        ctx.attempts,
        ctx.stage,
        elapsed * 1000,
        _usage_brief(ctx.usage),
    )


def _usage_brief(usage: dict[str, Any] | None) -> str:
    if not usage:
        return "-"
    return f"{usage.get('prompt_tokens')}/{usage.get('completion_tokens')}"
