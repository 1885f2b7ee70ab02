"""Request contexts for unit tests: what the stages before the one under test
would have written, built from the stages' own record types."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from gateway.config.schema import TimeoutsConfig
from gateway.ingress.protocol import parse_request
from gateway.policies.policyset import Policy
from gateway.request.context import Contract, Deadline, Parsed, RequestContext
from gateway.request.parsed import ClientDeadlines


def make_ctx(
    *,
    text: str = "hi",
    body: Mapping[str, Any] | None = None,
    session: str | None = None,
    tenant: str | None = None,
    policy: Policy | None = None,
    priority: str | None = None,
    prompt: int | None = None,
    output: int | None = None,
    deadline_in: float | None = 60.0,
    headers: Mapping[str, str] | None = None,
    received_at: float | None = None,
) -> RequestContext:
    """A context as the pipeline leaves it after the policy and deadlines stages.

    `priority` without `policy` builds a policy of that priority class;
    `deadline_in=None` leaves the deadline unresolved."""
    now = time.monotonic() if received_at is None else received_at
    ctx = RequestContext(
        request_id="r",
        endpoint="chat",
        path="/v1/chat/completions",
        headers=dict(headers or {}),
        received_at=now,
    )
    ctx.tenant = tenant
    raw = json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": text}], **(body or {})}
    ).encode()
    ctx.parsed = Parsed(parse_request("chat", raw), session, ClientDeadlines())
    if policy is None and (priority is not None or prompt is not None or output is not None):
        policy = Policy(name="default", priority=priority or "standard")
    if policy is not None:
        ctx.contract = Contract(policy, prompt_tokens=prompt, output_limit=output)
    if deadline_in is not None:
        ctx.deadline = Deadline(now + deadline_in, "policy_default", TimeoutsConfig())
    return ctx
