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

Requests and tokens per minute are sliding windows (an amount counts for
60 s from when it was reserved), so a burst across a minute boundary cannot
reach twice the limit. A session's first- and last-seen times are stamped in
the same store operation as its reservation: one round trip per request.

Keys (the store adds `state.key_prefix`; `{...}` is a Redis Cluster hash tag,
so the keys of one request share a slot): `t:{<tenant>}:conc|rpm|tpm`, and per
session `<tag>:s:<hash of tenant + session key>:req|tok|first|last`, where
the tag is the tenant's when it has limits (one reserve covers both) else
the session's own; session keys expire after the policy's
`session.idle_ttl_s` without activity.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

import xxhash
from prometheus_client import CollectorRegistry, Counter

from gateway.config.schema import GatewayConfig
from gateway.deadlines import deadline as deadlines
from gateway.errors import RateLimited
from gateway.policies.policyset import SessionSpec
from gateway.policy.estimate import MAX_OVERCOUNT
from gateway.policy.tokens import described
from gateway.request.context import RequestContext
from gateway.state import Claim, Reservation, StateStore
from gateway.state.base import ReserveResult, Rider, Stamp

WINDOW_S = 60.0
_RESERVATION_SLACK_S = 60.0


#: what a rule counts: concurrent requests, requests per window, a session's requests, tokens
Measure = Literal["conc", "requests", "session_requests", "tokens"]


@dataclass(frozen=True, slots=True)
class Rule:
    """What a claim stands for: how to settle it and how to refuse it."""

    claim: Claim
    reason: str
    measure: Measure
    retry_after: float | None = None

    @property
    def session(self) -> bool:
        return self.reason.startswith("session")


#: a reservation, the rules it claims for, and the worst case it reserved
Held = tuple[Reservation, list[Rule], int]


class Budgets:
    def __init__(
        self,
        cfg: GatewayConfig,
        store: StateStore,
        *,
        wall: Callable[[], float] = time.time,
        metrics_registry: CollectorRegistry | None = None,
        count_exactly: Callable[[RequestContext], Awaitable[bool]] | None = None,
    ) -> None:
        self._cfg = cfg
        self._store = store
        self._wall = wall
        self._count_exactly = count_exactly
        self.rejections = Counter(
            "gateway_budget_rejections",
            "Requests refused by a tenant limit or session budget, by reason.",
            ["reason"],
            registry=metrics_registry or CollectorRegistry(),
        )

    async def take(self, ctx: RequestContext, rider: Rider | None = None) -> Held | None:
        """Reserve the worst case (RateLimited if a limit is reached); None when
        no limit applies. Settled by `gateway.pipeline.release` (`settle`).
        A `rider`'s reads go with the reservation (and its writes with the
        settle) when there is one."""
        return await self._enter(ctx, rider) if self.applies(ctx) else None

    def applies(self, ctx: RequestContext) -> bool:
        """Whether any limit or budget may apply (most requests: none, and
        entering is then free)."""
        if ctx.tenant is not None and ctx.tenant in self._cfg.auth.tenants:
            return True
        contract = ctx.contract
        return (
            bool(ctx.session_key) and contract is not None and contract.policy.session is not None
        )

    async def _enter(self, ctx: RequestContext, rider: Rider | None) -> Held | None:
        entered = await self._reserve(ctx, rider)
        if entered is None:
            return None
        result, rules, worst = entered
        if result.reservation is None:
            rule = next(r for r in rules if r.claim.key == result.failed_key)
            if await self._recounted(ctx, rule, result):
                return await self._enter(ctx, rider)
            raise self._refusal(rule, result, _counted(ctx))
        return result.reservation, rules, worst

    async def _reserve(
        self, ctx: RequestContext, rider: Rider | None
    ) -> tuple[ReserveResult, list[Rule], int] | None:
        worst = (ctx.prompt_tokens or 0) + (ctx.output_limit or 0) * ctx.choices
        rules = self._tenant_rules(ctx, worst)
        session = ctx.contract.policy.session if ctx.contract is not None else None
        skey = self._session_key(ctx, bool(rules)) if session is not None else None
        stamps: list[Stamp] = []
        now = self._wall()
        if session is not None and skey is not None:
            rules += self._session_rules(skey, session, worst)
            now_ms = int(now * 1000)
            stamps = [
                Stamp(skey + ":first", now_ms, session.idle_ttl_s, only_if_absent=True),
                Stamp(skey + ":last", now_ms, session.idle_ttl_s),
            ]
        if not rules:
            return None
        reads = rider.reads if rider is not None else ()
        result = await self._store.reserve(
            [r.claim for r in rules], self._reservation_ttl(ctx), stamps, reads
        )
        if rider is not None:
            rider.texts = result.texts
            rider.carried = result.reservation is not None
        if session is not None and stamps:
            await self._check_duration(ctx, session, result, now)
        return result, rules, worst

    async def _recounted(self, ctx: RequestContext, rule: Rule, result: ReserveResult) -> bool:
        """Whether a token budget refused an estimated prompt by less than the
        estimate's margin and the prompt is now counted exactly (then the
        reservation is tried again, once: the count is no longer an estimate)."""
        contract, limit = ctx.contract, rule.claim.limit
        if rule.measure != "tokens" or self._count_exactly is None or limit is None:
            return False
        if contract is None or contract.prompt_source != "estimate":
            return False
        prompt = contract.prompt_tokens or 0
        lowest = rule.claim.amount - prompt + math.ceil(prompt / MAX_OVERCOUNT)
        if result.current + lowest > limit:
            return False
        return await self._count_exactly(ctx)

    async def settle(self, ctx: RequestContext, held: Held, rider: Rider | None = None) -> None:
        """Settle a reservation with what the request used, with the rider's
        writes (its own store call: the caller shields it)."""
        res, rules, worst = held
        actual = {r.claim.key: _kept(r, ctx, worst) for r in rules}
        await self._store.settle(res, actual, rider.writes if rider is not None else ())

    def _reservation_ttl(self, ctx: RequestContext) -> float:
        now = time.monotonic()
        remaining = (ctx.deadline.at if ctx.deadline is not None else now) - now
        return max(1.0, remaining) + _RESERVATION_SLACK_S

    def _refusal(self, rule: Rule, result: ReserveResult, counted: str) -> RateLimited:
        self.rejections.labels(rule.reason).inc()
        c, current = rule.claim, result.current
        what = {
            "conc": "concurrent requests",
            "requests": "requests per minute",
            "session_requests": "requests in this session",
            "tokens": "tokens",
        }[rule.measure]
        scope = "Session budget" if rule.session else "Rate limit"
        message = (
            f"{scope} exceeded ({rule.reason}): the limit is {c.limit} {what}; {current} are "
            "used or "
            f"reserved and this request needs {c.amount}"
            + (f" (its prompt {counted})." if rule.measure == "tokens" else ".")
        )
        fits_at_all = c.limit is not None and c.amount <= c.limit
        retry = rule.retry_after
        if c.window_s is not None:
            retry = result.retry_after_s if result.retry_after_s is not None else c.window_s
        retry = retry if fits_at_all else None
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
        if tenant is None or ctx.tenant is None:
            return []
        base = f"t:{{{_tag(ctx.tenant)}}}"
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
            claim = Claim(f"{base}:rpm", 1, tenant.requests_per_min, ttl, WINDOW_S)
            rules.append(Rule(claim, "tenant_requests_per_min", "requests"))
        if tenant.tokens_per_min is not None:
            claim = Claim(f"{base}:tpm", worst, tenant.tokens_per_min, ttl, WINDOW_S)
            rules.append(Rule(claim, "tenant_tokens_per_min", "tokens"))
        return rules

    def _session_key(self, ctx: RequestContext, with_tenant: bool) -> str | None:
        if not ctx.session_key:
            return None
        return _session_stem(ctx.tenant, ctx.session_key, with_tenant)

    # --- the admin API's session table (never on the request path) -------------

    async def count_sessions(self) -> int:
        """Sessions whose budget counters the store holds (until `idle_ttl_s`)."""
        return await self._store.count_keys("*s:*:last")

    async def session_counters(self, tenant: str | None, session_key: str) -> dict[str, int] | None:
        """One session's counters: requests and tokens (settled, plus reserved
        by its requests in flight), first and last seen (epoch ms); None when
        the store holds none."""
        t = self._cfg.auth.tenants.get(tenant) if tenant is not None else None
        limited = t is not None and (
            t.max_concurrent is not None
            or t.requests_per_min is not None
            or t.tokens_per_min is not None
        )
        stem = _session_stem(tenant, session_key, limited)
        values = await self._store.get([stem + f for f in (":req", ":tok", ":first", ":last")])
        if not any(values):
            return None
        return dict(
            zip(("requests", "tokens", "first_seen_ms", "last_seen_ms"), values, strict=True)
        )

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

    async def _check_duration(
        self, ctx: RequestContext, spec: SessionSpec, result: ReserveResult, now: float
    ) -> None:
        """Refuse a session past its wall-time budget (the reservation just made
        is given back); else bound this request's deadline by what is left."""
        first_ms = result.stamps[0] if result.stamps else int(now * 1000)
        if spec.max_duration_s is None:
            return
        left = first_ms / 1000 + spec.max_duration_s - now
        if left > 0:
            deadlines.tighten(ctx, time.monotonic() + left, "session")
            return
        if result.reservation is not None:
            await self._store.release(result.reservation)
        self.rejections.labels("session_duration").inc()
        err = RateLimited(
            f"Session budget exceeded (session_duration): the session started "
            f"{math.floor(now - first_ms / 1000)} s ago and may last {spec.max_duration_s:g} s.",
            code="session_budget_exceeded",
            reason="session_duration",
        )
        err.should_retry = False
        raise err


def _counted(ctx: RequestContext) -> str:
    return described(ctx.contract.prompt_source if ctx.contract is not None else "estimate")


def _kept(rule: Rule, ctx: RequestContext, worst: int) -> int:
    reached = ctx.upstream_status is not None
    match rule.measure:
        case "conc":
            return 0
        case "requests":
            return 1
        case "session_requests":
            return 1 if reached else 0
        case _:
            return _tokens_used(ctx, worst)


def _tokens_used(ctx: RequestContext, worst: int) -> int:
    usage = ctx.usage
    total = usage.total_tokens if usage is not None else None
    if total is None and usage is not None:
        parts = [p for p in (usage.prompt_tokens, usage.completion_tokens) if p is not None]
        total = sum(parts) if parts else None
    if total is not None:
        return min(max(0, total), worst)
    return worst if ctx.upstream_status == 200 else 0


def _session_stem(tenant: str | None, session_key: str, with_tenant: bool) -> str:
    """The session's key stem; it shares the tenant's hash tag when the
    tenant's claims go into the same reserve."""
    digest = xxhash.xxh3_128_hexdigest(f"{tenant or ''}\x00{session_key}".encode())
    if with_tenant and tenant is not None:
        return f"t:{{{_tag(tenant)}}}:s:{digest}"
    return f"s:{{{digest}}}"


def _tag(name: str) -> str:
    """A name usable inside a Redis Cluster hash tag (no braces)."""
    return name.replace("{", "(").replace("}", ")")
