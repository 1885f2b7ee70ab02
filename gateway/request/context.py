"""The per-request context: one typed record per stage, each written by the stage that owns it.

    RequestContext             written by
     ├── request_id, headers   the endpoint (pipeline.endpoint), at entry
     ├── serving_task          the endpoint
     ├── response              the endpoint's tracked `send`: started, complete
     ├── tenant                auth (ingress.auth)
     ├── parsed: Parsed        ingress (ingress.stage): body, session key, deadline headers
     ├── contract: Contract    policy (policy.stage): task policy, prompt tokens, output limit,
     │                         forwarded model, cache isolation
     ├── deadline: Deadline    deadlines (deadlines.deadline): instant, source, timeouts, timer
     ├── routing: Routing      scheduling (scheduling.router): prefix blocks, expected cache
     │                         hits, pinned slot
     ├── admission: Admission  admission (admission.controller): queue and admit instants
     ├── progress, replica,    the pipeline's dispatch loop (pipeline.pipeline)
     │   attempts
     ├── exchange: Exchange    forward (forward.forwarder): the current upstream exchange
     └── outcome, reason,      the pipeline (`finish`, once), then its record
         finished_at           (pipeline.record)

Later stages read what earlier ones wrote; no stage writes another's record.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from gateway.config.schema import TimeoutsConfig
from gateway.policies.policyset import Policy
from gateway.replicas.registry import Replica
from gateway.request.parsed import ClientDeadlines, ParsedRequest
from gateway.request.timer import RequestTimer


@dataclass(slots=True, eq=False)
class ClientResponse:
    """What has gone out to the client (the endpoint's tracked `send`)."""

    started: bool = False
    complete: bool = False


@dataclass(slots=True, eq=False)
class Parsed:
    """Ingress: the parsed body, the session key, the client's deadline headers."""

    request: ParsedRequest
    session_key: str | None
    client_deadlines: ClientDeadlines


class Isolation(NamedTuple):
    """The tenant's `cache_salt` (None: the client's salt is dropped, none is sent)."""

    salt: str | None


@dataclass(slots=True, eq=False)
class Contract:
    """Policy: the task's policy and the limits it set for this request."""

    policy: Policy
    prompt_tokens: int | None = None
    #: how `prompt_tokens` was counted (`TokenCount.source`: estimate, engine, cache, ...)
    prompt_source: str = "estimate"
    output_limit: int | None = None
    #: the model name forwarded when the policy maps an alias (None: the client's)
    model: str | None = None
    #: cache isolation: the `cache_salt` forwarded in place of any the client sent
    isolation: Isolation | None = None
    #: the client's output request when the policy clamped it
    clamped_from: int | None = None
    #: sequences the engine generates (`n`, or vLLM's `best_of` when larger)
    choices: int = 1

    @property
    def task(self) -> str:
        return self.policy.name

    @property
    def priority(self) -> str:
        return self.policy.priority

    def headers(self) -> list[tuple[str, str]]:
        """The response headers that state the contract (`x-gateway-*`)."""
        out = [("x-gateway-task", self.policy.name)]
        if self.prompt_tokens is not None:
            out.append(("x-gateway-input-tokens", str(self.prompt_tokens)))
        if self.clamped_from is not None:
            out.append(("x-gateway-output-clamped-from", str(self.clamped_from)))
        if self.output_limit is not None:
            out.append(("x-gateway-output-limit", str(self.output_limit)))
        return out


#: Why the deadline falls when it does: the policy's default or maximum, the
#: client's header, the SDK's own timeout (bounds the start), the session's budget.
DeadlineSource = Literal[
    "policy_default",
    "policy_max",
    "x-request-deadline",
    "x-request-timeout",
    "x-stainless-timeout",
    "session",
]


@dataclass(slots=True, eq=False)
class Deadline:
    """Deadlines: the request's bound (a `time.monotonic()` instant) and timeouts."""

    at: float
    source: DeadlineSource
    timeouts: TimeoutsConfig
    #: the response must start by then (the client SDK's timeout), if earlier than `at`
    start_at: float | None = None
    #: the request's one timer while the exchange runs
    timer: RequestTimer | None = None


class PrefixBlocks(NamedTuple):
    """One prompt's chained block hashes and its size (a NamedTuple: built per request)."""

    hashes: tuple[int, ...]
    prompt_bytes: int
    block_bytes: int
    #: The implicit session key of a chat without one (`conversation.py`), else None.
    conversation: str | None = None
    #: The chat has messages after its first user message (a later turn).
    follow_up: bool = False
    #: Bytes before the chat's first user message (tools, system prompt), shared by
    #: many conversations (`conversation.py`); 0 when unknown.
    shared_bytes: int = 0

    @property
    def hashed_bytes(self) -> int:
        return len(self.hashes) * self.block_bytes


@dataclass(slots=True, eq=False)
class Routing:
    """Scheduling: prefix blocks (computed once) and expected cache hits."""

    prefix: PrefixBlocks | None = None
    #: replica name -> prompt tokens the prefix index expects cached there
    #: (admission reserves prefill work = prompt - cached)
    cached_tokens: dict[str, int] = field(default_factory=dict)
    #: stamps of the blocks the chosen replica's prefix index matched when the
    #: request was routed there (`PrefixIndex.stamps`; the answer corrects it)
    index_stamps: tuple[int, ...] = ()
    #: the engine slot the router wrote into the body, and the body field it wrote
    #: (`EngineAdapter.slot_field`; cleared on a retry elsewhere)
    pinned_slot: int | None = None
    pinned_field: str | None = None
    #: the session's replica as the shared state store knows it (several instances)
    session_replica: str | None = None


@dataclass(slots=True, eq=False)
class Admission:
    """Admission: when the request joined the queue and was admitted."""

    queued_at: float | None = None
    admitted_at: float | None = None
    #: run once when the first response byte arrives (ends the lease's prefill claim)
    on_first_byte: Callable[[], None] | None = None


def _count(value: Any) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return value if ok else None


@dataclass(frozen=True, slots=True)
class Usage:
    """The engine's `usage`, as token counts (None: not reported, or not a count)."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None
    #: prompt tokens served from the engine's prefix cache (its adapter reads them)
    cached_tokens: int | None = None

    @classmethod
    def of(cls, usage: Mapping[str, Any], cached_tokens: int | None = None) -> Usage:
        """From the engine's JSON object (values checked, not trusted)."""
        return cls(
            _count(usage.get("prompt_tokens")),
            _count(usage.get("completion_tokens")),
            _count(usage.get("total_tokens")),
            _count(cached_tokens),
        )


ExchangePhase = Literal["waiting_first_byte", "streaming"]
Progress = Literal["ingress", "routing", "queued"]
#: Where a request is (the `stage` label): the dispatch loop's progress, then the exchange's phase.
Stage = Literal["ingress", "routing", "queued", "waiting_first_byte", "streaming"]
#: How a request ended ("pending" until the pipeline answered it); an error's
#: reason (`GatewayError.reason`) is `RequestContext.reason`.
Outcome = Literal["pending", "ok", "error", "cancelled"]


@dataclass(slots=True, eq=False)
class Exchange:
    """Forward: the current upstream exchange."""

    sent_at: float
    phase: ExchangePhase = "waiting_first_byte"
    status: int | None = None
    first_byte_at: float | None = None
    usage: Usage | None = None


@dataclass(slots=True, eq=False)
class RequestContext:
    request_id: str
    endpoint: str
    path: str
    headers: Mapping[str, str]  # lower-case names (see `header_map`)
    received_at: float
    client_host: str | None = None
    serving_task: asyncio.Task[Any] | None = None
    response: ClientResponse = field(default_factory=ClientResponse)
    tenant: str | None = None
    parsed: Parsed | None = None
    contract: Contract | None = None
    deadline: Deadline | None = None
    routing: Routing = field(default_factory=Routing)
    admission: Admission = field(default_factory=Admission)
    #: where the dispatch loop is before an exchange starts
    progress: Progress = "ingress"
    replica: Replica | None = None
    attempts: int = 0
    exchange: Exchange | None = None
    outcome: Outcome = "pending"
    #: the error's reason when `outcome` is "error" ("internal_error" for a bug)
    reason: str | None = None
    finished_at: float | None = None

    def finish(self, outcome: Outcome, reason: str | None = None) -> None:
        """Set how the request ended (the pipeline, once it answered): `reason`
        is required for an error and refused otherwise."""
        if (outcome == "error") != (reason is not None) or outcome == "pending":
            raise ValueError(f"outcome {outcome!r} with reason {reason!r}")
        self.outcome, self.reason = outcome, reason

    @property
    def outcome_label(self) -> str:
        """The `outcome` label of the request metrics: the error's reason, else the outcome."""
        return self.reason if self.reason is not None else self.outcome

    # --- read-only views over the records --------------------------------

    @property
    def request(self) -> ParsedRequest | None:
        parsed = self.parsed
        return parsed.request if parsed is not None else None

    @property
    def session_key(self) -> str | None:
        parsed = self.parsed
        return parsed.session_key if parsed is not None else None

    @property
    def model(self) -> str | None:
        """The model name forwarded: the policy's alias target, else the client's."""
        contract = self.contract
        if contract is not None and contract.model is not None:
            return contract.model
        parsed = self.parsed
        return parsed.request.model if parsed is not None else None

    @property
    def cache_salt(self) -> str | None:
        """The `cache_salt` forwarded: the tenant's under isolation, else the client's."""
        contract = self.contract
        if contract is not None and contract.isolation is not None:
            return contract.isolation.salt
        parsed = self.parsed
        salt = parsed.request.body.get("cache_salt") if parsed is not None else None
        return salt if isinstance(salt, str) else None

    @property
    def task(self) -> str:
        contract = self.contract
        return contract.policy.name if contract is not None else "default"

    @property
    def priority(self) -> str:
        contract = self.contract
        return contract.policy.priority if contract is not None else "standard"

    @property
    def prompt_tokens(self) -> int | None:
        contract = self.contract
        return contract.prompt_tokens if contract is not None else None

    @property
    def output_limit(self) -> int | None:
        contract = self.contract
        return contract.output_limit if contract is not None else None

    @property
    def choices(self) -> int:
        """Sequences the engine generates for this request (each up to `output_limit`)."""
        contract = self.contract
        return contract.choices if contract is not None else 1

    @property
    def stage(self) -> Stage:
        """Where the request is: ingress, routing, queued, waiting_first_byte, streaming."""
        exchange = self.exchange
        return exchange.phase if exchange is not None else self.progress

    @property
    def usage(self) -> Usage | None:
        exchange = self.exchange
        return exchange.usage if exchange is not None else None

    @property
    def first_byte_at(self) -> float | None:
        exchange = self.exchange
        return exchange.first_byte_at if exchange is not None else None

    @property
    def upstream_status(self) -> int | None:
        exchange = self.exchange
        return exchange.status if exchange is not None else None

    @property
    def queue_seconds(self) -> float:
        a = self.admission
        if a.queued_at is None or a.admitted_at is None:
            return 0.0
        return max(0.0, a.admitted_at - a.queued_at)

    def gateway_headers(self) -> list[tuple[str, str]]:
        """Headers every answer carries that the stages stated (the contract's)."""
        contract = self.contract
        return contract.headers() if contract is not None else []


def header_map(raw: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """Request headers by lower-case name, decoded once. A repeated header keeps
    its first value, as Starlette's `Headers.get` does."""
    out: dict[str, str] = {}
    for key, value in raw:
        name = key.decode("latin-1").lower()
        if name not in out:
            out[name] = value.decode("latin-1")
    return out
