"""Tenant and session budgets: reserve the worst case before dispatch, settle after.

Every limit that applies to a request becomes one `Claim` and all of them go
into one atomic `StateStore.reserve`, so concurrent requests can never push
a counter past its limit (all or nothing). The worst case is the prompt
count plus the output limit the policy stage decided. On exit the
reservation is settled with what really happened:

- tokens: `usage.total_tokens` (capped at the reservation); the whole
  reservation when the engine answered 200 but no usage arrived (a cut
  stream); 0 when the engine was never reached or answered an error;
- requests: 1 (the session counts it only if an engine was reached);
- concurrency: 0 (released).

Keys (prefix `state.key_prefix`): `t:<tenant>:conc`, `t:<tenant>:rpm:<minute>`,
`t:<tenant>:tpm:<minute>` (fixed one-minute windows), and per session
`s:<hash of tenant + session key>:{req,tok,first,last}` expiring after the
policy's `session.idle_ttl_s` without activity.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import xxhash
from prometheus_client import CollectorRegistry, Counter

from gateway.config.schema import GatewayConfig
from gateway.deadlines import deadline as deadlines
from gateway.errors import RateLimited
from gateway.pipeline.context import RequestContext
from gateway.policy.policyset import SessionSpec
from gateway.state import Claim, Reservation, StateStore

WINDOW_S = 60
_RESERVATION_SLACK_S = 60.0


@dataclass(frozen=True, slots=True)
class Rule:
    """What a claim stands for: how to settle it and how to refuse it."""

    claim: Claim
    reason: str
    kind: str  # conc | requests | session_requests | tokens
    retry_after: float | None = None

    @property
    def session(self) -> bool:
        return self.reason.startswith("session")


class Budgets:
    def __init__(
        self,
        cfg: GatewayConfig,
        store: StateStore,
        *,
        wall: Callable[[], float] = time.time,
        metrics_registry: CollectorRegistry | None = None,
    ) -> None:
        self._cfg = cfg
        self._store = store
        self._wall = wall
        self._prefix = cfg.state.key_prefix
        self.rejections = Counter(
            "gateway_budget_rejections",
            "Requests refused by a tenant limit or session budget, by reason.",
            ["reason"],
            registry=metrics_registry or CollectorRegistry(),
        )

    @contextlib.asynccontextmanager
    async def reserve(self, ctx: RequestContext) -> AsyncIterator[None]:
        """`async with budgets.reserve(ctx):` — reserve the worst case on entry
        (RateLimited if a limit is reached), settle with what happened on exit."""
        held = await self._enter(ctx) if self.applies(ctx) else None
        try:
            yield
        finally:
            if held is not None:
                await self._exit(ctx, held)

    def applies(self, ctx: RequestContext) -> bool:
        """Whether any limit or budget may apply (most requests: none, and
        entering is then free)."""
        if ctx.tenant is not None and ctx.tenant in self._cfg.auth.tenants:
            return True
        contract = ctx.contract
        return (
            bool(ctx.session_key) and contract is not None and contract.policy.session is not None
        )

    async def _enter(self, ctx: RequestContext) -> tuple[Reservation, list[Rule], int] | None:
        worst = (ctx.prompt_tokens or 0) + (ctx.output_limit or 0)
        rules = self._tenant_rules(ctx, worst)
        session = ctx.contract.policy.session if ctx.contract is not None else None
        skey = self._session_key(ctx) if session is not None else None
        if session is not None and skey is not None:
            await self._check_duration(ctx, skey, session)
            rules += self._session_rules(skey, session, worst)
        if not rules:
            return None
        res = await self._reserve(ctx, rules)
        if session is not None and skey is not None:
            await self._store.put(skey + ":last", int(self._wall() * 1000), session.idle_ttl_s)
        return res, rules, worst

    async def _exit(self, ctx: RequestContext, held: tuple[Reservation, list[Rule], int]) -> None:
        res, rules, worst = held
        actual = {r.claim.key: _kept(r, ctx, worst) for r in rules}
        await asyncio.shield(self._store.settle(res, actual))

    async def _reserve(self, ctx: RequestContext, rules: list[Rule]) -> Reservation:
        now = time.monotonic()
        remaining = (ctx.deadline.at if ctx.deadline is not None else now) - now
        result = await self._store.reserve(
            [r.claim for r in rules], max(1.0, remaining) + _RESERVATION_SLACK_S
        )
        if result.reservation is not None:
            return result.reservation
        rule = next(r for r in rules if r.claim.key == result.failed_key)
        raise self._refusal(ctx, rule, result.current)

    def _refusal(self, ctx: RequestContext, rule: Rule, current: int) -> RateLimited:
        self.rejections.labels(rule.reason).inc()
        c = rule.claim
        what = {
            "conc": "concurrent requests",
            "requests": "requests per minute",
            "session_requests": "requests in this session",
            "tokens": "tokens",
        }[rule.kind]
        scope = "Session budget" if rule.session else "Rate limit"
        message = (
            f"{scope} exceeded ({rule.reason}): the limit is {c.limit} {what}; {current} are "
            "used or "
            f"reserved and this request needs {c.amount}."
        )
        fits_at_all = c.limit is not None and c.amount <= c.limit
        retry = rule.retry_after if fits_at_all else None
        err = RateLimited(
            message,
            code="session_budget_exceeded" if rule.session else "rate_limit_exceeded",
            reason=rule.reason,
            retry_after=retry,
        )
        if retry is None:
            err.should_retry = False
        return err

    def _tenant_rules(self, ctx: RequestContext, worst: int) -> list[Rule]:
        tenant = self._cfg.auth.tenants.get(ctx.tenant) if ctx.tenant is not None else None
        if tenant is None:
            return []
        base = f"{self._prefix}t:{ctx.tenant}"
        now = self._wall()
        window = int(now // WINDOW_S)
        to_next = (window + 1) * WINDOW_S - now
        ttl = 2.0 * WINDOW_S
        rules = []
        if tenant.max_concurrent is not None:
            rules.append(
                Rule(
                    Claim(f"{base}:conc", 1, tenant.max_concurrent),
                    "tenant_concurrency",
                    "conc",
                    1.0,
                )
            )
        if tenant.requests_per_min is not None:
            claim = Claim(f"{base}:rpm:{window}", 1, tenant.requests_per_min, ttl)
            rules.append(Rule(claim, "tenant_requests_per_min", "requests", to_next))
        if tenant.tokens_per_min is not None:
            claim = Claim(f"{base}:tpm:{window}", worst, tenant.tokens_per_min, ttl)
            rules.append(Rule(claim, "tenant_tokens_per_min", "tokens", to_next))
        return rules

    def _session_key(self, ctx: RequestContext) -> str | None:
        if not ctx.session_key:
            return None
        digest = xxhash.xxh3_128_hexdigest(f"{ctx.tenant or ''}\x00{ctx.session_key}".encode())
        return f"{self._prefix}s:{digest}"

    def _session_rules(self, skey: str, spec: SessionSpec, worst: int) -> list[Rule]:
        ttl = spec.idle_ttl_s
        return [
            Rule(
                Claim(skey + ":req", 1, spec.max_requests, ttl),
                "session_requests",
                "session_requests",
            ),
            Rule(
                Claim(skey + ":tok", worst, spec.max_total_tokens, ttl), "session_tokens", "tokens"
            ),
        ]

    async def _check_duration(self, ctx: RequestContext, skey: str, spec: SessionSpec) -> None:
        now = self._wall()
        first_ms = await self._store.put(
            skey + ":first", int(now * 1000), spec.idle_ttl_s, only_if_absent=True
        )
        if spec.max_duration_s is None:
            return
        left = first_ms / 1000 + spec.max_duration_s - now
        if left <= 0:
            self.rejections.labels("session_duration").inc()
            err = RateLimited(
                f"Session budget exceeded (session_duration): the session started "
                f"{math.floor(now - first_ms / 1000)} s ago and may last "
                f"{spec.max_duration_s:g} s.",
                code="session_budget_exceeded",
                reason="session_duration",
            )
            err.should_retry = False
            raise err
        deadlines.tighten(ctx, time.monotonic() + left, "session")


def _kept(rule: Rule, ctx: RequestContext, worst: int) -> int:
    reached = ctx.upstream_status is not None
    if rule.kind == "conc":
        return 0
    if rule.kind == "requests":
        return 1
    if rule.kind == "session_requests":
        return 1 if reached else 0
    return _tokens_used(ctx, worst)


def _tokens_used(ctx: RequestContext, worst: int) -> int:
    usage = ctx.usage or {}
    total = usage.get("total_tokens")
    if not isinstance(total, int):
        parts = [usage.get("prompt_tokens"), usage.get("completion_tokens")]
        total = (
            sum(p for p in parts if isinstance(p, int))
            if any(isinstance(p, int) for p in parts)
            else None
        )
    if total is not None:
        return min(max(0, total), worst)
    return worst if ctx.upstream_status == 200 else 0
