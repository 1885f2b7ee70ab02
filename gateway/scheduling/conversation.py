"""A chat's opening: its implicit session key, and how much of it is shared.

A conversation resends its history every turn, so its first messages (the
system prompt, if any, through the first user message) are the same on
every turn and differ between conversations that share only a system
prompt. Their hash, seeded like the prefix blocks (model and cache salt, so
tenants never share a key), is the conversation's session key: its turns
stay together even when the prompt is shorter than one prefix block, which
the prefix index cannot see, and a llama.cpp replica keeps its slot.

What comes before the first user message (tools, system prompt) is what
many conversations share; a cached prefix no longer than that says nothing
about where *this* conversation has been (`Opening.shared_bytes`, in bytes
of the canonical rendering of `prefix.render`).

Only a later turn (`Opening.follow_up`) follows the key: a first turn is
just its opening, and identical openings (the same question from many
clients, the same request sent concurrently) must spread by load. Two
conversations that open with the same messages share the key, and their
later turns then go where either went last; they share a cached prefix too.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, NamedTuple

import xxhash

from gateway.ingress.protocol import canonical_json, prompt_parts
from gateway.scheduling.prefix import render, seed_of

if TYPE_CHECKING:
    from gateway.request.parsed import ParsedRequest


class Opening(NamedTuple):
    #: `conv:<hash>` of the tools and the messages through the first user message
    key: str
    #: bytes of the canonical prompt before the first user message
    shared_bytes: int
    #: messages follow the first user message: a later turn of the conversation
    follow_up: bool


def opening(req: ParsedRequest, seed: int | None = None) -> Opening | None:
    """The chat's opening; None for completions, or a chat without a user message.
    `seed`: of the model and cache salt forwarded (default: the client's)."""
    if req.endpoint != "chat":
        return None
    messages = req.body.get("messages")
    if not isinstance(messages, list):
        return None
    first_user = next(
        (i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"),
        None,
    )
    if first_user is None:
        return None
    if seed is None:
        salt = req.body.get("cache_salt")
        seed = seed_of(req.model, salt if isinstance(salt, str) else None)
    shared = _rendered_before(req, messages[:first_user])
    user = canonical_json(messages[first_user]).encode("utf-8", "surrogatepass")
    key = xxhash.xxh3_64_hexdigest(shared + b"\x00" + user, seed)
    shared_bytes = len(shared) + 1 if shared else 0  # + the separator before the next part
    return Opening(f"conv:{key}", shared_bytes, first_user + 1 < len(messages))


def _rendered_before(req: ParsedRequest, before: list[object]) -> bytes:
    """The canonical rendering of the tools and the messages before the first user message."""
    body = {k: v for k, v in req.body.items() if k != "messages"}
    body["messages"] = before
    head = dataclasses.replace(req, body=body, parts=None, raw=None, original=None)
    parts = prompt_parts(head)
    return render(parts) if parts else b""
