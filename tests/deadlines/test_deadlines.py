"""Deadline headers and resolution: pure logic (injected clocks, no sockets)."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import MutableMapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.datastructures import Headers

from gateway.config.schema import GatewayConfig, TimeoutsConfig
from gateway.deadlines import deadline as deadlines
from gateway.deadlines.client import parse_headers
from gateway.deadlines.deadline import resolve
from gateway.errors import DeadlineExceeded, InvalidDeadlineHeader, error_headers
from gateway.ingress.protocol import parse_request
from gateway.pipeline import release
from gateway.policies.policyset import DeadlineSpec, Policy, TimeoutsSpec
from gateway.request.context import Contract, Deadline, Parsed, RequestContext
from gateway.request.parsed import ClientDeadlines

WALL0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
MONO0 = 1000.0


def wall() -> float:
    return WALL0


def mono() -> float:
    return MONO0


def parse(**headers: str) -> ClientDeadlines:
    raw = {k.replace("_", "-"): v for k, v in headers.items()}
    return parse_headers(Headers(raw), MONO0, wall=wall, mono=mono)


def ctx_with(client: ClientDeadlines | None = None, policy: Policy | None = None) -> RequestContext:
    ctx = RequestContext(
        request_id="r", endpoint="chat", path="/", headers=Headers({}), received_at=MONO0
    )
    request = parse_request(
        "chat", b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
    )
    ctx.parsed = Parsed(request, None, client or ClientDeadlines())
    ctx.contract = Contract(policy) if policy is not None else None
    return ctx


def at(ctx: RequestContext) -> tuple[float, str]:
    assert ctx.deadline is not None
    return ctx.deadline.at, ctx.deadline.source


def fixed(ctx: RequestContext, when: float, source: str, start_at: float | None = None) -> None:
    """Give `ctx` a resolved deadline (what `resolve` would set)."""
    ctx.deadline = Deadline(when, source, TimeoutsConfig(), start_at)


async def started_send(ctx: RequestContext) -> Any:
    """A client `send` that records the response start, as the endpoint's does."""

    async def send(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            ctx.response.started = True

    return send


@pytest.mark.parametrize(
    "value",
    [
        "1767225630",
        "1767225630.0",
        " 1767225630 ",
        "2026-01-01T00:00:30Z",
        "2026-01-01T01:00:30+01:00",
        "2026-01-01t00:00:30.000z",
    ],
)
def test_absolute_deadline_forms(value: str) -> None:
    assert parse(x_request_deadline=value).absolute == pytest.approx(MONO0 + 30)


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("x-request-deadline", "tomorrow"),
        ("x-request-deadline", "2026-01-01T00:00:30"),  # RFC 3339 needs an offset
        ("x-request-deadline", "nan"),
        ("x-request-deadline", "-5"),
        ("x-request-deadline", ""),
        ("x-request-timeout", "0"),
        ("x-request-timeout", "-1"),
        ("x-request-timeout", "inf"),
        ("x-request-timeout", "5s"),
        ("x-stainless-timeout", "None"),
        ("x-stainless-read-timeout", "abc"),
    ],
)
def test_malformed_headers_are_400_naming_the_header(header: str, value: str) -> None:
    with pytest.raises(InvalidDeadlineHeader) as exc:
        parse_headers(Headers({header: value}), MONO0, wall=wall, mono=mono)
    assert exc.value.status == 400
    assert exc.value.param == header
    assert header.lower() in exc.value.message.lower()


def test_relative_and_client_timeouts() -> None:
    got = parse(x_request_timeout="2.5", x_stainless_timeout="600", x_stainless_read_timeout="30.0")
    assert got.relative == pytest.approx(MONO0 + 2.5)
    assert got.client_timeout_s == 30.0
    assert parse() == ClientDeadlines()


def test_default_applies_without_explicit_deadline() -> None:
    ctx = ctx_with()
    resolve(ctx, GatewayConfig(timeouts=TimeoutsConfig(total_s=120)), mono=mono)
    assert at(ctx) == (MONO0 + 120, "policy_default")
    assert ctx.deadline is not None
    assert ctx.deadline.timeouts == TimeoutsConfig(total_s=120)
    assert ctx.deadline.start_at is None


def test_explicit_deadline_may_exceed_the_default_up_to_the_max() -> None:
    policy = Policy(name="long", deadline=DeadlineSpec(default_s=60, max_s=600))
    ctx = ctx_with(ClientDeadlines(relative=MONO0 + 300), policy)
    resolve(ctx, GatewayConfig(), mono=mono)
    assert at(ctx) == (MONO0 + 300, "x-request-timeout")
    ctx = ctx_with(ClientDeadlines(relative=MONO0 + 3000), policy)
    resolve(ctx, GatewayConfig(), mono=mono)
    assert at(ctx) == (MONO0 + 600, "policy_max")
    ctx = ctx_with(None, policy)
    resolve(ctx, GatewayConfig(), mono=mono)
    assert at(ctx) == (MONO0 + 60, "policy_default")


def test_session_deadline_and_client_timeout() -> None:
    ctx = ctx_with(ClientDeadlines(absolute=MONO0 + 50, client_timeout_s=20))
    resolve(ctx, GatewayConfig(timeouts=TimeoutsConfig(idle_s=60)), mono=mono)
    assert at(ctx) == (MONO0 + 50, "x-request-deadline")
    deadlines.tighten(ctx, MONO0 + 40, "session")  # the budgets stage, once the session is known
    deadlines.tighten(ctx, MONO0 + 45, "later")  # never moves a deadline later
    assert at(ctx) == (MONO0 + 40, "session")
    # The SDK timeout bounds the response start and the idle gap, not the stream.
    assert ctx.deadline is not None
    assert ctx.deadline.start_at == MONO0 + 20
    assert ctx.deadline.timeouts.idle_s == 20
    assert deadlines.timer_deadline(ctx) == (MONO0 + 20, "x-stainless-timeout")
    ctx.response.started = True
    assert deadlines.timer_deadline(ctx) == (MONO0 + 40, "session")


def test_per_policy_timeouts_override_config() -> None:
    policy = Policy(name="p", timeouts=TimeoutsSpec(first_byte_s=900.0))
    got = deadlines.policy_timeouts(policy, TimeoutsConfig(first_byte_s=10, idle_s=5))
    assert got == TimeoutsConfig(first_byte_s=900, idle_s=5)
    assert deadlines.policy_timeouts(Policy(name="p"), TimeoutsConfig()) == TimeoutsConfig()


finite = st.floats(min_value=0.001, max_value=1e6)


@given(
    default=finite,
    extra=finite,
    total=finite,
    absolute=st.none() | finite,
    relative=st.none() | finite,
    session=st.none() | finite,
)
def test_effective_deadline_is_the_earliest_applicable_bound(
    default: float,
    extra: float,
    total: float,
    absolute: float | None,
    relative: float | None,
    session: float | None,
) -> None:
    policy = Policy(name="p", deadline=DeadlineSpec(default_s=default, max_s=default + extra))
    client = ClientDeadlines(
        None if absolute is None else MONO0 + absolute,
        None if relative is None else MONO0 + relative,
    )
    ctx = ctx_with(client, policy)
    bounds = [default + extra] + [b for b in (absolute, relative) if b is not None]
    if absolute is None and relative is None:
        bounds.append(default)
    if min(bounds) < deadlines.MIN_REMAINING_S:
        with pytest.raises(DeadlineExceeded) as exc:  # already as good as past: refused
            resolve(ctx, GatewayConfig(timeouts=TimeoutsConfig(total_s=total)), mono=mono)
        assert exc.value.should_retry is False
        return
    resolve(ctx, GatewayConfig(timeouts=TimeoutsConfig(total_s=total)), mono=mono)
    if session is not None:
        deadlines.tighten(ctx, MONO0 + session, "session")
    assert ctx.deadline is not None
    bounds = [default + extra] + [b for b in (absolute, relative, session) if b is not None]
    if absolute is None and relative is None:
        bounds.append(default)
    assert math.isclose(ctx.deadline.at - MONO0, min(bounds), rel_tol=1e-9, abs_tol=1e-6)


def test_upstream_header_is_absolute_unix_seconds() -> None:
    ctx = ctx_with()
    fixed(ctx, MONO0 + 12.5, "policy_default")
    assert deadlines.upstream_deadline_header(ctx, wall=wall, mono=mono) == f"{WALL0 + 12.5:.3f}"


def test_deadline_error_says_whether_to_retry() -> None:
    ctx = ctx_with()
    absolute = deadlines.deadline_error(ctx, "x-request-deadline")
    assert error_headers(absolute)["x-should-retry"] == "false"
    assert error_headers(absolute)["x-gateway-reject-reason"] == "deadline_exceeded"
    assert "x-should-retry" not in error_headers(deadlines.deadline_error(ctx, "policy_default"))


async def _noop_send(message: MutableMapping[str, Any]) -> None:
    return None


def test_enforce_expiry_and_reschedule_at_response_start() -> None:
    async def scenario() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        ctx = ctx_with()
        ctx.received_at = now = time.monotonic()
        fixed(ctx, now + 0.6, "x-request-deadline", start_at=now + 0.1)
        # Not started: the start deadline (0.1 s) fires.
        t0 = loop.time()
        with pytest.raises(DeadlineExceeded) as exc:
            async with release.timer(ctx, _noop_send):
                await asyncio.sleep(5)
        first = loop.time() - t0
        assert exc.value.should_retry is None  # the client's own timeout: a fresh try may succeed
        # Started: the timer moves to the total deadline (0.6 s).
        t0 = loop.time()
        with pytest.raises(DeadlineExceeded) as exc:
            async with release.timer(ctx, await started_send(ctx)) as send:
                await send({"type": "http.response.start", "status": 200, "headers": []})
                await asyncio.sleep(5)
        assert exc.value.should_retry is False
        assert ctx.deadline is not None and ctx.deadline.timer is None
        return first, loop.time() - t0

    first, second = asyncio.run(scenario())
    assert 0.05 < first < 0.5, first
    assert 0.3 < second < 2.0, second


def test_tighten_reschedules_a_running_timer() -> None:
    async def scenario() -> float:
        ctx = ctx_with()
        now = time.monotonic()
        fixed(ctx, now + 30, "policy_default")
        t0 = time.monotonic()
        with pytest.raises(DeadlineExceeded) as exc:
            async with release.timer(ctx, _noop_send):
                deadlines.tighten(ctx, time.monotonic() + 0.1, "session")
                await asyncio.sleep(5)
        assert "session" in exc.value.message
        return time.monotonic() - t0

    assert asyncio.run(scenario()) < 2.0
