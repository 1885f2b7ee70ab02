"""The per-request context that flows through the pipeline.

ingress → policy → route → admit → forward → settle: each stage reads what
earlier stages wrote and adds its own fields; no stage reaches back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.datastructures import Headers

if TYPE_CHECKING:
    from gateway.protocol import ParsedRequest
    from gateway.replicas import Replica


@dataclass(slots=True, eq=False)
class RequestContext:
    request_id: str
    endpoint: str
    path: str
    headers: Headers
    received_at: float
    client_host: str | None = None
    # ingress
    request: ParsedRequest | None = None
    deadline: float | None = None
    deadline_source: str = "config"
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
    candidates: list[Replica] = field(default_factory=list)
    replica: Replica | None = None
    attempts: int = 0
    queued_at: float | None = None
    admitted_at: float | None = None
    # forward
    stage: str = "ingress"
    response_started: bool = False
    response_complete: bool = False
    first_byte_at: float | None = None
    usage: dict[str, Any] | None = None
    upstream_status: int | None = None
    # settle
    outcome: str = "pending"
    finished_at: float | None = None
    response_headers: dict[str, str] = field(default_factory=dict)
    upstream_headers: dict[str, str] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def queue_seconds(self) -> float:
        if self.queued_at is None or self.admitted_at is None:
            return 0.0
        return max(0.0, self.admitted_at - self.queued_at)
