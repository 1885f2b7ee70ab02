"""Deadlines: resolve the effective deadline and per-request timeouts, and
enforce them around the exchange (`ctx.deadline`, a `Deadline` record this
module alone writes).

Sources (monotonic instants; the client's headers are parsed at ingress by
`gateway.deadlines.client`):

- `X-Request-Deadline` (absolute) and `X-Request-Timeout` (relative).
- `X-Stainless-Timeout` / `X-Stainless-Read-Timeout`: the SDK's own client
  timeout. Both SDKs stop the clock once response headers arrive, and
  openai-python's read timeout then bounds every gap between chunks. So the
  client timeout bounds the time to the *response start* (the whole
  exchange for a non-streaming request, the queue wait and prefill for a
  stream) and the idle gap of a stream; it does not cut a stream whose
  tokens keep flowing.
- The task policy's `deadline.default_s` (used when the client states no
  explicit deadline; else the policy's `timeouts.total_s`, else the
  config's) and `deadline.max_s`.
- The session's wall-time budget, applied by the budgets stage through
  `tighten` once the session is known.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping, Sequence
from typing import Any

from gateway.config.schema import GatewayConfig, TimeoutsConfig
from gateway.deadlines.client import DEADLINE_HEADER, TIMEOUT_HEADER
from gateway.errors import DeadlineExceeded, ShuttingDown
from gateway.policies.policyset import Policy
from gateway.request.context import Deadline, DeadlineSource, RequestContext
from gateway.request.parsed import ClientDeadlines
from gateway.request.timer import RequestTimer

Clock = Callable[[], float]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

#: A deadline closer than this when resolved cannot cover even an idle engine's
#: round trip: refused before any engine work.
MIN_REMAINING_S = 0.005
#: `RequestTimer.interrupt` kind that ends a request at the end of a shutdown's grace period.
SHUTDOWN = "shutdown"
#: Sources after which a retry cannot help: the instant is fixed.
ABSOLUTE_SOURCES = frozenset({DEADLINE_HEADER, "session"})
_NO_CLIENT = ClientDeadlines()


def resolve(ctx: RequestContext, cfg: GatewayConfig, mono: Clock = time.monotonic) -> Deadline:
    """Set `ctx.deadline` from the client's headers and the task policy (run
    after the policy stage). A session deadline found later is applied with
    `tighten`."""
    parsed = ctx.parsed
    client = parsed.client_deadlines if parsed is not None else _NO_CLIENT
    policy = ctx.contract.policy if ctx.contract is not None else None
    base = policy_timeouts(policy, cfg.timeouts)
    default_s = policy.deadline.default_s if policy is not None else None
    max_s = policy.deadline.max_s if policy is not None else None
    default_s = default_s if default_s is not None else base.total_s
    cap_s = max_s if max_s is not None else max(default_s, cfg.timeouts.total_s)
    # The earliest of: the client's header deadline (else the policy default),
    # the policy maximum; on a tie, the first named.
    source: DeadlineSource
    if client.absolute is None and client.relative is None:
        when, source = ctx.received_at + default_s, "policy_default"
    else:
        explicit = _earliest(
            [(client.absolute, DEADLINE_HEADER), (client.relative, TIMEOUT_HEADER)]
        )
        assert explicit is not None
        when, source = explicit
    if ctx.received_at + cap_s < when:
        when, source = ctx.received_at + cap_s, "policy_max"
    start_at = None
    if client.client_timeout_s is not None:
        start_at = ctx.received_at + client.client_timeout_s
        if client.client_timeout_s < base.idle_s:
            base = _idle_capped(base, client.client_timeout_s)
    ctx.deadline = Deadline(when, source, base, start_at)
    now = mono()
    if when - now < MIN_REMAINING_S or (start_at is not None and start_at - now < MIN_REMAINING_S):
        # Already past (or as good as): never forwarded, never queued; the same
        # request with the same headers would fail the same way.
        err = deadline_error(ctx, timer_deadline(ctx)[1])
        err.should_retry = False
        raise err
    return ctx.deadline


@functools.lru_cache(maxsize=256)
def _idle_capped(base: TimeoutsConfig, idle_s: float) -> TimeoutsConfig:
    # The OpenAI SDKs send their timeout on every request (a handful of values).
    return dataclasses.replace(base, idle_s=idle_s)


def policy_timeouts(policy: Policy | None, defaults: TimeoutsConfig) -> TimeoutsConfig:
    """Per-policy `timeouts:` (connect_s, first_byte_s, idle_s, total_s; any may be
    omitted or None) over the config's `timeouts` section."""
    if policy is None:
        return defaults
    return _merged_timeouts(policy.timeouts, defaults)


@functools.lru_cache(maxsize=256)
def _merged_timeouts(spec: Any, defaults: TimeoutsConfig) -> TimeoutsConfig:
    # Both frozen (hashable) dataclasses: a policy set holds a handful of specs.
    given = {f.name: getattr(spec, f.name, None) for f in dataclasses.fields(defaults)}
    return dataclasses.replace(defaults, **{k: float(v) for k, v in given.items() if v is not None})


def tighten(ctx: RequestContext, when: float, source: DeadlineSource) -> None:
    """Move the deadline earlier (e.g. a session budget found after `resolve`),
    rescheduling the running timer if there is one."""
    d = ctx.deadline
    if d is None or d.at <= when:
        return
    d.at, d.source = when, source
    if d.timer is not None:
        d.timer.set_deadline(_loop_time(timer_deadline(ctx)[0]))


def _loop_time(when: float) -> float:
    return asyncio.get_running_loop().time() + (when - time.monotonic())


def _earliest(
    items: Sequence[tuple[float | None, DeadlineSource]],
) -> tuple[float, DeadlineSource] | None:
    present = [(when, src) for when, src in items if when is not None]
    return min(present, key=lambda item: item[0]) if present else None


def timer_deadline(ctx: RequestContext) -> tuple[float, DeadlineSource]:
    """The instant the exchange must stop now, and why."""
    d = ctx.deadline
    assert d is not None
    if d.start_at is not None and not ctx.response.started and d.start_at < d.at:
        return d.start_at, "x-stainless-timeout"
    return d.at, d.source


def upstream_deadline_header(
    ctx: RequestContext, wall: Clock = time.time, mono: Clock = time.monotonic
) -> str:
    """The absolute `X-Request-Deadline` (Unix seconds) to forward upstream.

    A stream must finish by the total deadline; a non-streaming exchange must
    also finish before the client gives up waiting for the response start."""
    d = ctx.deadline
    assert d is not None
    when = d.at
    req = ctx.request
    if d.start_at is not None and req is not None and not req.stream:
        when = min(when, d.start_at)
    return f"{wall() + (when - mono()):.3f}"


def deadline_error(ctx: RequestContext, source: DeadlineSource) -> DeadlineExceeded:
    err = DeadlineExceeded(
        f"The request did not finish within its deadline ({source}); stage: {ctx.stage}."
    )
    if source in ABSOLUTE_SOURCES:
        # The instant is fixed: an automatic retry (the SDKs retry 5xx) cannot succeed.
        err.should_retry = False
    return err


def shutting_down_error() -> ShuttingDown:
    return ShuttingDown(
        "The gateway is shutting down; retry the request (another instance can serve it).",
        retry_after=1.0,
    )


def interrupt(ctx: RequestContext) -> bool:
    """End a request running under `enforce` now with `ShuttingDown` (an SSE
    error event once its stream has started). False when it is not (yet, or
    any longer) under a timer."""
    d = ctx.deadline
    return d is not None and d.timer is not None and d.timer.interrupt(SHUTDOWN)


def arm(ctx: RequestContext) -> RequestTimer:
    """Start the request's one `RequestTimer` (`ctx.deadline.timer`), which
    `enforce` and the forwarder's connect / first-byte / idle bounds use.
    Stopped by `disarm` (`gateway.pipeline.release`)."""
    d = ctx.deadline
    assert d is not None
    t = d.timeouts
    horizon = min(t.first_byte_s, t.idle_s, t.total_s)
    timer = d.timer = RequestTimer(_loop_time(timer_deadline(ctx)[0]), horizon, ctx.serving_task)
    return timer


def disarm(ctx: RequestContext) -> None:
    """Stop the request's timer; idempotent."""
    d = ctx.deadline
    timer = d.timer if d is not None else None
    if d is not None and timer is not None:
        d.timer = None
        timer.close()


@contextlib.asynccontextmanager
async def enforce(ctx: RequestContext, send: Send) -> AsyncIterator[Send]:
    """Bound the body of the block by the request's deadline (its timer armed).

    Yields the `send` to use inside: it moves the timer from the
    response-start deadline (client timeout) to the total deadline once the
    response starts. On expiry the block is cancelled (closing the upstream
    connection) and `DeadlineExceeded` is raised; when a shutdown interrupts
    it (`interrupt(ctx)`), `ShuttingDown`."""
    d = ctx.deadline
    assert d is not None and d.timer is not None, "arm the timer first"
    timer = d.timer

    async def timed_send(message: MutableMapping[str, Any]) -> None:
        started = ctx.response.started
        await send(message)
        if not started and message["type"] == "http.response.start" and d.start_at is not None:
            timer.set_deadline(_loop_time(timer_deadline(ctx)[0]))

    try:
        yield timed_send
    except asyncio.CancelledError:
        if timer.claim("deadline"):
            raise deadline_error(ctx, timer_deadline(ctx)[1]) from None
        if timer.claim(SHUTDOWN):
            raise shutting_down_error() from None
        raise
