"""The request's record: the last step of every request, on every path.

It releases nothing (that is `release.py`); it records the request's
metrics (count and duration by task and outcome, time to first byte) and,
when `access_log` is on, one access-log line (never the body, headers or
session key; with `log_format: json` its fields are the JSON
object's, see `access_fields`).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from gateway.observability.metrics import GatewayMetrics
from gateway.request.context import RequestContext, Usage

log = logging.getLogger("gateway.access")


class Recorder:
    def __init__(self, metrics: GatewayMetrics, access_log: bool) -> None:
        self._metrics = metrics
        self._access_log = access_log

    def record(self, ctx: RequestContext) -> None:
        ctx.finished_at = time.monotonic()
        elapsed = ctx.finished_at - ctx.received_at
        m = self._metrics
        m.requests_by(ctx.task, ctx.outcome_label).inc()
        m.duration_by(ctx.task, ctx.outcome_label).observe(elapsed)
        first_byte_at = ctx.first_byte_at
        if first_byte_at is not None:
            m.ttfb_by(ctx.task).observe(first_byte_at - ctx.received_at)
        usage = ctx.usage
        if usage is not None:
            _count_tokens(m, ctx.task, usage)
        if self._access_log and log.isEnabledFor(logging.INFO):
            _access_line(ctx, elapsed)


def _count_tokens(m: GatewayMetrics, task: str, usage: Usage) -> None:
    for direction, n in (
        ("prompt", usage.prompt_tokens),
        ("completion", usage.completion_tokens),
        ("cached", usage.cached_tokens),
    ):
        if n:
            m.tokens_by(task, direction).inc(n)


def _access_line(ctx: RequestContext, elapsed: float) -> None:
    fields = access_fields(ctx, elapsed)
    text = " ".join(f"{k}={'-' if v is None else v}" for k, v in fields.items())
    log.info("request %s", text, extra=fields)


def access_fields(ctx: RequestContext, elapsed: float) -> dict[str, Any]:
    """The access line's fields (`log_format: json` emits them as they are).
    `outcome` is ok, error or cancelled; `reason` the error's reason (the
    `outcome` label of the request metrics)."""
    usage = ctx.usage or Usage()
    first_byte_at = ctx.first_byte_at
    return {
        "id": ctx.request_id,
        "tenant": ctx.tenant,
        "task": ctx.task,
        "replica": ctx.replica.name if ctx.replica else None,
        "outcome": ctx.outcome,
        "reason": ctx.reason,
        "status": ctx.upstream_status,
        "attempts": ctx.attempts,
        "stage": ctx.stage,
        "queue_ms": _ms(ctx.queue_seconds) if ctx.admission.admitted_at is not None else None,
        "ttfb_ms": None if first_byte_at is None else _ms(first_byte_at - ctx.received_at),
        "total_ms": _ms(elapsed),
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
    }


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)
