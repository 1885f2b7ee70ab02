"""What ingress parsed: the request body and the client's deadline headers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Endpoint = Literal["chat", "completions"]


@dataclass(slots=True, eq=False)
class ParsedRequest:
    """A parsed request. Stages edit `body` at the top level only, by assigning
    or removing keys (never by mutating a nested value in place): the forwarder
    then sends the client's own bytes (`raw`), with added keys spliced in,
    whenever no key the client sent was changed (`gateway.forward.rawbody`)."""

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

    def set_model(self, model: str) -> None:
        self.model = model
        self.body["model"] = model


@dataclass(frozen=True, slots=True)
class ClientDeadlines:
    """What the client asked for, as monotonic instants (None: not sent)."""

    absolute: float | None = None
    relative: float | None = None
    client_timeout_s: float | None = None
