"""The per-request context that flows through the pipeline.

ingress → policy → route → admit → forward → settle: each stage reads what
earlier stages wrote and adds its own fields; no stage reaches back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

# Annotations naming these are quoted: the compiled build (mypyc, setup.py)
# evaluates a dataclass's unquoted annotations at import time.
if TYPE_CHECKING:
    from gateway.config.schema import TimeoutsConfig
    from gateway.deadlines.deadline import ClientDeadlines
    from gateway.ingress.protocol import ParsedRequest
    from gateway.replicas.registry import Replica
    from gateway.deadlines.timer import RequestTimer


@dataclass(slots=True, eq=False)
class RequestContext:
    request_id: str
    endpoint: str
    path: str
    headers: Mapping[str, str]  # lower-case names (see `header_map`)
    received_at: float
    client_host: str | None = None
    # ingress
    request: "ParsedRequest | None" = None
    deadline: float | None = None
    deadline_source: str = "config"
    # deadlines (gateway/deadlines/deadline.py): the client's headers, the effective
    # per-request timeouts, the session's deadline (a monotonic instant, set by
    # the session stage), the response-start deadline (client SDK timeout)
    client_deadlines: "ClientDeadlines | None" = None
    timeouts: "TimeoutsConfig | None" = None
    session_deadline: float | None = None
    start_deadline: float | None = None
    deadline_timer: "RequestTimer | None" = None
    serving_task: asyncio.Task[Any] | None = None  # the asyncio task serving the request (set by the endpoint)
    session_key: str | None = None
    # policy / auth
    tenant: str | None = None
    task: str = "default"
    priority: str = "standard"
    policy: Any = None
    prompt_tokens: int | None = None
    output_limit: int | None = None
    # route / admit
    prefix: Any = None
    # replica name -> prompt tokens the router expects cached there (admission: prefill = prompt - cached)
    cached_tokens: dict[str, int] = field(default_factory=dict)
    replica: "Replica | None" = None
    attempts: int = 0
    queued_at: float | None = None
    admitted_at: float | None = None
    # forward
    stage: str = "ingress"
    response_started: bool = False
    response_complete: bool = False
    first_byte_at: float | None = None
    # run once when the first response byte arrives (admission ends the lease's prefill claim)
    first_byte_hooks: list[Callable[[], None]] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    upstream_status: int | None = None
    # settle
    outcome: str = "pending"
    finished_at: float | None = None
    response_headers: dict[str, str] = field(default_factory=dict)
    upstream_headers: dict[str, str] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)

    def mark_first_byte(self, now: float, run_hooks: bool = True) -> None:
        """`run_hooks=False` when the whole answer arrived at once: what the hooks
        would release early (the lease's prefill claim) is released by settling."""
        self.first_byte_at = now
        hooks, self.first_byte_hooks = self.first_byte_hooks, []
        if not run_hooks:
            return
        for hook in hooks:
            hook()

    @property
    def queue_seconds(self) -> float:
        if self.queued_at is None or self.admitted_at is None:
            return 0.0
        return max(0.0, self.admitted_at - self.queued_at)


def header_map(raw: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """Request headers by lower-case name, decoded once. A repeated header keeps
    its first value, as Starlette's `Headers.get` does."""
    out: dict[str, str] = {}
    for key, value in raw:
        name = key.decode("latin-1").lower()
        if name not in out:
            out[name] = value.decode("latin-1")
    return out
