"""The policy stage: resolve the task of a request and enforce its contract.

Task resolution: the `X-Task` header (unknown → 400 listing the known
tasks), else the requested model when it is a policy's alias (the real
model name is forwarded), else the tenant's default task, else the default
policy. Then, before any engine work: the tenant's allowed tasks (403),
cache isolation, the input count (`tokens:` mode), the
input limit, the output limit (default injected; clamp or reject), and the
context check against the largest `max_model_len` among healthy replicas
serving the model (skipped while unknown). The policy's `deadline` and
`timeouts` are applied next by `gateway.deadlines.resolve` (it reads
`ctx.contract`).

The active policy set is one immutable object swapped by `reload()`; a
request reads it once, so a reload never mixes two sets in one request.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter

from gateway.config.decode import ConfigError
from gateway.config.schema import GatewayConfig, LimitsConfig, TenantConfig
from gateway.errors import ContextLengthExceeded, Forbidden, UnknownTask
from gateway.forward.upstream import UpstreamClient
from gateway.observability.cells import LockFreeCounter
from gateway.observability.metrics import Children
from gateway.policies.policyset import Policy, PolicySet, load_policy_set
from gateway.policy.estimate import MAX_OVERCOUNT
from gateway.policy.limits import check_floor, check_limits, fits, true_floor
from gateway.policy.tokens import (
    LRU,
    OFFLOAD_BYTES,
    EngineCounter,
    EstimateCounter,
    LocalTokenizerCounter,
    TokenCount,
    TokenCounter,
)
from gateway.replicas.registry import Replica, ReplicaRegistry
from gateway.request.context import Contract, Isolation, RequestContext
from gateway.request.later import Later, Step
from gateway.request.parsed import ParsedRequest

log = logging.getLogger("gateway.policy.stage")


@dataclass(frozen=True, slots=True)
class ActivePolicies:
    policies: PolicySet
    counters: Mapping[str, TokenCounter]


class PolicyMetrics:
    def __init__(self, registry: CollectorRegistry | None) -> None:
        r = registry or CollectorRegistry()
        self.token_counts = LockFreeCounter(
            "gateway_token_counts",
            "Prompt token counts by source (estimate, engine, cache, fallback, tokenizer).",
            ["source"],
            registry=r,
        )
        self.reloads = Counter(
            "gateway_policy_reloads",
            "Policy reloads by result (ok, refused).",
            ["result"],
            registry=r,
        )
        self.output_clamped = Counter(
            "gateway_output_clamped",
            "Requests whose output limit was clamped.",
            ["task"],
            registry=r,
        )
        self.token_counts_by = Children(self.token_counts)


def build_counters(
    policies: PolicySet,
    engine: EngineCounter | None,
    limits: LimitsConfig,
    parts: LRU | None = None,
) -> dict[str, TokenCounter]:
    counters: dict[str, TokenCounter] = {}
    estimate = EstimateCounter(parts)
    problems: list[str] = []
    for p in policies.policies:
        if p.tokens == "engine" and engine is not None:
            counters[p.name] = engine
        elif p.tokens == "tokenizer" and p.tokenizer:
            try:
                counters[p.name] = LocalTokenizerCounter(p.tokenizer, limits.max_bytes_per_token)
            except (ImportError, OSError, ValueError) as exc:
                problems.append(f"{policies.sources.get(p.name, p.name)}: tokenizer: {exc}")
        else:
            counters[p.name] = estimate
    if problems:
        raise ConfigError(problems)
    return counters


def check_policies(cfg: GatewayConfig) -> PolicySet:
    """Validate the policies a config refers to (raises ConfigError)."""
    policies = load_policy_set(cfg.policies, cfg.auth)
    build_counters(policies, None, cfg.limits)
    return policies


class PolicyStage:
    def __init__(
        self,
        cfg: GatewayConfig,
        registry: ReplicaRegistry,
        client: UpstreamClient,
        metrics_registry: CollectorRegistry | None = None,
    ) -> None:
        self._cfg = cfg
        self._registry = registry
        self._parts = LRU(max(65536, cfg.tokens.cache_entries))  # ~150 B per part
        self._engine = EngineCounter(
            client, cfg.tokens, self._parts, cfg.limits.max_bytes_per_token
        )
        self.metrics = PolicyMetrics(metrics_registry)
        self._active = self._load()

    @property
    def policies(self) -> PolicySet:
        return self._active.policies

    def _load(self) -> ActivePolicies:
        policies = load_policy_set(self._cfg.policies, self._cfg.auth)
        return ActivePolicies(
            policies, build_counters(policies, self._engine, self._cfg.limits, self._parts)
        )

    def reload(self) -> PolicySet:
        """Load the policy directory again; on any error keep the current set and raise "
        "ConfigError."""
        try:
            active = self._load()
        except ConfigError as exc:
            self.metrics.reloads.labels("refused").inc()
            log.error(
                "policy reload refused, keeping the current set:\n  %s", "\n  ".join(exc.problems)
            )
            raise
        self._active = active
        self.metrics.reloads.labels("ok").inc()
        log.info("policies reloaded: %s", ", ".join(p.name for p in active.policies.policies))
        return active.policies

    def apply(self, ctx: RequestContext) -> Step:
        """Resolve the task and enforce its limits. Returns None when done, or a
        `Later` to finish with when counting the prompt needs an engine round
        trip (most counts do not: an estimate, a cached count; a coroutine
        would cost every request; `gateway.request.later`)."""
        active = self._active
        req = ctx.request
        assert req is not None
        tenant = self._cfg.auth.tenants.get(ctx.tenant) if ctx.tenant is not None else None
        policy = resolve(active.policies, ctx, req, tenant)
        contract = ctx.contract = Contract(policy)
        alias = active.policies.by_alias.get(req.model or "")
        if alias is not None and alias.model:
            contract.model = alias.model
        if policy.isolation == "tenant":
            contract.isolation = _isolation(ctx.tenant, self._cfg.auth.isolation_secret)
        replicas = serving_replicas(self._registry, ctx.model)
        counter = active.counters[policy.name]
        if req.size >= OFFLOAD_BYTES:
            check_floor(contract, req, true_floor(counter, req), _max_model_len(replicas))
        counted = counter.count_now(req, replicas, ctx.model)
        if isinstance(counted, Later):
            return Later(self._limit_when_counted(contract, req, replicas, counted))
        return self._limit(contract, req, replicas, counted)

    async def _limit_when_counted(
        self,
        contract: Contract,
        req: ParsedRequest,
        replicas: list[Replica],
        counting: Later[TokenCount],
    ) -> None:
        recount = self._limit(contract, req, replicas, await counting)
        if recount is not None:
            await recount

    def _limit(
        self, contract: Contract, req: ParsedRequest, replicas: list[Replica], counted: TokenCount
    ) -> Step:
        """Apply the limits at `counted`. An estimate refused by less than
        its error margin (`MAX_OVERCOUNT`) is not refused yet: the returned
        `Later` counts the prompt exactly (the engine's count, cached) and
        decides on that."""
        max_model_len = _max_model_len(replicas)
        try:
            check_limits(contract, req, counted, max_model_len)
        except ContextLengthExceeded:
            lower = TokenCount(math.ceil(counted.tokens / MAX_OVERCOUNT), counted.source)
            if counted.source != "estimate" or not fits(contract, req, lower, max_model_len):
                raise
            return Later(self._limit_exactly(contract, req, replicas, counted))
        self._counted(contract, counted)
        return None

    async def _limit_exactly(
        self, contract: Contract, req: ParsedRequest, replicas: list[Replica], estimate: TokenCount
    ) -> None:
        exact = await self._engine.count(req, replicas, contract.model or req.model)
        counted = estimate if exact.source == "fallback" else exact
        check_limits(contract, req, counted, _max_model_len(replicas))
        self._counted(contract, counted)

    async def count_exactly(self, ctx: RequestContext) -> bool:
        """Count an estimated prompt exactly (the engine's count, cached) and
        keep the count when it is exact; whether it was. A token budget about
        to refuse on an estimate asks first (`Budgets`)."""
        contract, req = ctx.contract, ctx.request
        if contract is None or req is None or contract.prompt_source != "estimate":
            return False
        replicas = serving_replicas(self._registry, ctx.model)
        exact = await self._engine.count(req, replicas, ctx.model)
        if exact.source == "fallback":
            return False
        self.metrics.token_counts_by(exact.source).inc()
        contract.prompt_tokens, contract.prompt_source = exact.tokens, exact.source
        return True

    def _counted(self, contract: Contract, counted: TokenCount) -> None:
        self.metrics.token_counts_by(counted.source).inc()
        if contract.clamped_from is not None:
            self.metrics.output_clamped.labels(contract.policy.name).inc()


def resolve(
    policies: PolicySet, ctx: RequestContext, req: ParsedRequest, tenant: TenantConfig | None
) -> Policy:
    header = (ctx.headers.get("x-task") or "").strip()
    if header:
        policy = policies.by_task.get(header)
        if policy is None:
            raise UnknownTask(
                f"Unknown task {header[:64]!r} in the X-Task header. "
                f"Known tasks: {', '.join(policies.known_tasks)}.",
                param="X-Task",
            )
    elif req.model in policies.by_alias:
        policy = policies.by_alias[req.model or ""]
    elif tenant is not None and tenant.default_task:
        policy = policies.get(tenant.default_task) or policies.default
    else:
        policy = policies.default
    if tenant is not None and tenant.allowed_tasks and policy.name not in tenant.allowed_tasks:
        raise Forbidden(
            f"Task '{policy.name}' is not allowed for this API key. "
            f"Allowed tasks: {', '.join(tenant.allowed_tasks)}.",
            param="X-Task",
        )
    return policy


def serving_replicas(registry: ReplicaRegistry, model: str | None) -> list[Replica]:
    """Healthy replicas that list `model` (all healthy ones if none lists it)."""
    healthy = registry.healthy()
    if model:
        serving = [r for r in healthy if any(m.get("id") == model for m in r.models)]
        if serving:
            return serving
    return healthy


def _max_model_len(replicas: list[Replica]) -> int | None:
    lens = [r.max_model_len for r in replicas if r.max_model_len]
    return max(lens) if lens else None


def tenant_salt(secret: str, tenant: str | None) -> str:
    mac = hmac.new(secret.encode(), b"cache_salt\x00" + (tenant or "").encode(), hashlib.sha256)
    return mac.hexdigest()[:32]


def _isolation(tenant: str | None, secret: str) -> Isolation:
    """The tenant's salt in place of any the client sent; without auth (one
    tenant) none."""
    return Isolation(tenant_salt(secret, tenant) if tenant is not None and secret else None)
