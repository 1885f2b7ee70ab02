"""What ingress parsed: the request body and the client's deadline headers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Endpoint = Literal["chat", "completions"]


@dataclass(slots=True, eq=False)
class ParsedRequest:
    """A parsed request, as the client sent it: no stage edits `body`. What the
    gateway changes upstream (model alias, cache salt, slot, output limit) is a
    typed field of the owning stage's record, applied once by the forwarder
    when it builds the upstream body, splicing added keys into the client's
    own bytes (`raw`) when no key it sent changed (`gateway.forward.rawbody`)."""

    endpoint: Endpoint
    body: dict[str, Any]
    model: str | None
    stream: bool
    client_wants_usage: bool
    requested_output: int | None
    output_field: str | None
    #: the client's bytes when they mean exactly `original` to any JSON parser
    raw: bytes | None = None
    #: the top level as parsed (a shallow copy)
    original: dict[str, Any] | None = None
    #: `prompt_parts`, rendered once (token estimate, prefix hashing and demand all walk it)
    parts: list[str] | None = None
    #: length of the body in bytes: at least the number of characters of its text
    size: int = 0


@dataclass(frozen=True, slots=True)
class ClientDeadlines:
    """What the client asked for, as monotonic instants (None: not sent)."""

    absolute: float | None = None
    relative: float | None = None
    client_timeout_s: float | None = None
