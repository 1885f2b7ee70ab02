"""Deadlines: parse the client's deadline headers, resolve the effective
deadline and per-request timeouts, and enforce them around the exchange.

Sources (all converted to `time.monotonic()` instants at receipt):

- `X-Request-Deadline`: absolute, Unix seconds (`1767225600.25`) or RFC 3339
  (`2026-01-01T00:00:00Z`, an offset is required).
- `X-Request-Timeout`: relative seconds.
- `X-Stainless-Timeout` (openai-node) / `X-Stainless-Read-Timeout`
  (openai-python): the SDK's own client timeout. Both SDKs stop the clock
  once response headers arrive, and openai-python's read timeout then
  bounds every gap between chunks. So the client timeout bounds the time to
  the *response start* (the whole exchange for a non-streaming request, the
  queue wait and prefill for a stream) and the idle gap of a stream; it
  does not cut a stream whose tokens keep flowing.
- The task policy's default (`ctx.timeouts.total_s`, used when the client
  states no explicit deadline) and maximum (`ctx.deadline_max_s`).
- The session's deadline (`ctx.session_deadline`, an agent chain's wall-time
  budget).

Malformed headers are a 400 naming the header (`param`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import math
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any

from gateway.config.schema import GatewayConfig, TimeoutsConfig
from gateway.pipeline.context import RequestContext
from gateway.errors import DeadlineExceeded, InvalidDeadlineHeader
from gateway.deadlines.timer import RequestTimer

Clock = Callable[[], float]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

DEADLINE_HEADER = "x-request-deadline"
TIMEOUT_HEADER = "x-request-timeout"
CLIENT_TIMEOUT_HEADERS = ("x-stainless-timeout", "x-stainless-read-timeout")
#: Sources after which a retry cannot help: the instant is fixed.
ABSOLUTE_SOURCES = frozenset({DEADLINE_HEADER, "session"})


@dataclass(frozen=True, slots=True)
class ClientDeadlines:
    """What the client asked for, as monotonic instants (None: not sent)."""

    absolute: float | None = None
    relative: float | None = None
    client_timeout_s: float | None = None


_NO_CLIENT = ClientDeadlines()
_ALL_HEADERS = (DEADLINE_HEADER, TIMEOUT_HEADER, *CLIENT_TIMEOUT_HEADERS)


def parse_headers(headers: Mapping[str, str], received_at: float,
                  wall: Clock = time.time, mono: Clock = time.monotonic) -> ClientDeadlines:
    """Parse the deadline headers of a request (raises `InvalidDeadlineHeader`)."""
    if not any(name in headers for name in _ALL_HEADERS):
        return _NO_CLIENT  # most requests: nothing to parse
    absolute = None
    raw = headers.get(DEADLINE_HEADER)
    if raw is not None:
        absolute = mono() + (_parse_instant(raw) - wall())
    relative = None
    raw = headers.get(TIMEOUT_HEADER)
    if raw is not None:
        relative = received_at + _parse_seconds(TIMEOUT_HEADER, raw)
    client = None
    for name in CLIENT_TIMEOUT_HEADERS:
        raw = headers.get(name)
        if raw is not None:
            value = _parse_seconds(name, raw)
            client = value if client is None else min(client, value)
    return ClientDeadlines(absolute, relative, client)


def _parse_instant(raw: str) -> float:
    text = raw.strip()
    try:
        value = float(text)
    except ValueError:
        value = _parse_rfc3339(text)
    if not math.isfinite(value) or value < 0:
        raise _bad(DEADLINE_HEADER, raw, "Unix seconds or an RFC 3339 timestamp with an offset")
    return value


def _parse_rfc3339(text: str) -> float:
    try:
        parsed = datetime.fromisoformat(text.upper())  # RFC 3339 allows "t" and "z"
    except ValueError:
        parsed = None
    if parsed is None or parsed.tzinfo is None:
        raise _bad(DEADLINE_HEADER, text, "Unix seconds or an RFC 3339 timestamp with an offset")
    return parsed.timestamp()


def _parse_seconds(name: str, raw: str) -> float:
    try:
        value = float(raw.strip())
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise _bad(name, raw, "a positive number of seconds")
    return value


def _bad(name: str, raw: str, expected: str) -> InvalidDeadlineHeader:
    shown = raw if len(raw) <= 64 else raw[:64] + "..."
    canonical = "-".join(part.capitalize() for part in name.split("-"))
    return InvalidDeadlineHeader(f"Invalid {canonical} header {shown!r}: expected {expected}.", param=name)


def resolve(ctx: RequestContext, cfg: GatewayConfig) -> None:
    """Set `ctx.deadline` (+ `deadline_source`), `ctx.start_deadline` and `ctx.timeouts`.

    Run after the policy stage (`ctx.policy`). A session deadline known by
    then (`ctx.session_deadline`) is included; one found later is applied
    with `tighten`."""
    client = ctx.client_deadlines or _NO_CLIENT
    base = policy_timeouts(ctx.policy, cfg.timeouts)
    default_s, max_s = _policy_deadline(ctx.policy)
    default_s = default_s if default_s is not None else base.total_s
    cap_s = max_s if max_s is not None else max(default_s, cfg.timeouts.total_s)
    # The earliest of: the client's header deadline (else the policy default),
    # the policy maximum, the session's deadline; on a tie, the first named.
    if client.absolute is None and client.relative is None:
        when, source = ctx.received_at + default_s, "policy_default"
    else:
        explicit = _earliest([(client.absolute, DEADLINE_HEADER), (client.relative, TIMEOUT_HEADER)])
        assert explicit is not None
        when, source = explicit
    if ctx.received_at + cap_s < when:
        when, source = ctx.received_at + cap_s, "policy_max"
    session = ctx.session_deadline
    if session is not None and session < when:
        when, source = session, "session"
    ctx.deadline, ctx.deadline_source = when, source
    if client.client_timeout_s is not None:
        ctx.start_deadline = ctx.received_at + client.client_timeout_s
        if client.client_timeout_s < base.idle_s:
            base = _idle_capped(base, client.client_timeout_s)
    ctx.timeouts = base


@functools.lru_cache(maxsize=256)
def _idle_capped(base: TimeoutsConfig, idle_s: float) -> TimeoutsConfig:
    # The OpenAI SDKs send their timeout on every request (a handful of values).
    return dataclasses.replace(base, idle_s=idle_s)


def policy_timeouts(policy: Any, defaults: TimeoutsConfig) -> TimeoutsConfig:
    """Per-policy `timeouts:` (connect_s, first_byte_s, idle_s, total_s; any may be
    omitted or None) over the config's `timeouts` section."""
    spec = getattr(policy, "timeouts", None)
    if spec is None:
        return defaults
    return _merged_timeouts(spec, defaults)


@functools.lru_cache(maxsize=256)
def _merged_timeouts(spec: Any, defaults: TimeoutsConfig) -> TimeoutsConfig:
    # Both frozen (hashable) dataclasses: a policy set holds a handful of specs.
    given = {f.name: getattr(spec, f.name, None) for f in dataclasses.fields(defaults)}
    return dataclasses.replace(defaults, **{k: float(v) for k, v in given.items() if v is not None})


def _policy_deadline(policy: Any) -> tuple[float | None, float | None]:
    """The policy's `deadline: {default_s, max_s}` (gateway/policy/policyset.py)."""
    spec = getattr(policy, "deadline", None)
    return getattr(spec, "default_s", None), getattr(spec, "max_s", None)


def tighten(ctx: RequestContext, when: float, source: str) -> None:
    """Move the deadline earlier (e.g. a session budget found after `resolve`),
    rescheduling the running timer if there is one."""
    if ctx.deadline is not None and ctx.deadline <= when:
        return
    ctx.deadline, ctx.deadline_source = when, source
    timer = ctx.deadline_timer
    if timer is not None:
        timer.set_deadline(_loop_time(timer_deadline(ctx)[0]))


def _loop_time(when: float) -> float:
    return asyncio.get_running_loop().time() + (when - time.monotonic())


def _earliest(items: Sequence[tuple[float | None, str]]) -> tuple[float, str] | None:
    present = [(when, src) for when, src in items if when is not None]
    return min(present, key=lambda item: item[0]) if present else None


def timer_deadline(ctx: RequestContext) -> tuple[float, str]:
    """The instant the exchange must stop now, and why."""
    assert ctx.deadline is not None
    if ctx.start_deadline is not None and not ctx.response_started and ctx.start_deadline < ctx.deadline:
        return ctx.start_deadline, "x-stainless-timeout"
    return ctx.deadline, ctx.deadline_source


def upstream_deadline_header(ctx: RequestContext, wall: Clock = time.time,
                             mono: Clock = time.monotonic) -> str:
    """The absolute `X-Request-Deadline` (Unix seconds) to forward upstream.

    A stream must finish by the total deadline; a non-streaming exchange must
    also finish before the client gives up waiting for the response start."""
    assert ctx.deadline is not None
    when = ctx.deadline
    req = ctx.request
    if ctx.start_deadline is not None and req is not None and not req.stream:
        when = min(when, ctx.start_deadline)
    return f"{wall() + (when - mono()):.3f}"


def deadline_error(ctx: RequestContext, source: str) -> DeadlineExceeded:
    err = DeadlineExceeded(f"The request did not finish within its deadline ({source}); stage: {ctx.stage}.")
    if source in ABSOLUTE_SOURCES:
        # The instant is fixed: an automatic retry (the SDKs retry 5xx) cannot succeed.
        err.should_retry = False
    return err


class enforce:
    """Bound the body of the block by the request's deadline.

    Yields the `send` to use inside: it moves the timer from the
    response-start deadline (client timeout) to the total deadline once the
    response starts. On expiry the block is cancelled (closing the upstream
    connection) and `DeadlineExceeded` is raised. The timer is the request's
    one `RequestTimer` (`ctx.deadline_timer`), which the forwarder also uses
    for its connect / first-byte / idle bounds."""

    __slots__ = ("_ctx", "_send", "_timer")

    def __init__(self, ctx: RequestContext, send: Send) -> None:
        self._ctx = ctx
        self._send = send
        self._timer: RequestTimer | None = None

    async def __aenter__(self) -> Send:
        ctx = self._ctx
        t = ctx.timeouts
        horizon = min(t.first_byte_s, t.idle_s, t.total_s) if t is not None else math.inf
        self._timer = ctx.deadline_timer = RequestTimer(_loop_time(timer_deadline(ctx)[0]), horizon, ctx.serving_task)
        return self._timed_send

    async def _timed_send(self, message: MutableMapping[str, Any]) -> None:
        await self._send(message)
        ctx = self._ctx
        if message["type"] == "http.response.start" and not ctx.response_started:
            ctx.response_started = True
            if self._timer is not None and ctx.start_deadline is not None:
                self._timer.set_deadline(_loop_time(timer_deadline(ctx)[0]))

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool:
        timer, self._timer = self._timer, None
        self._ctx.deadline_timer = None
        assert timer is not None
        timer.close()
        if exc_type is asyncio.CancelledError and timer.claim("deadline"):
            raise deadline_error(self._ctx, timer_deadline(self._ctx)[1]) from None
        return False
