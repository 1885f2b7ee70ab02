"""One simulated request: what was asked, its progress, and its record.

The engine pushes events (`Token`, `Finish`, `Failed`) into the request's
queue; the HTTP side turns them into the flavour's response body.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import asdict, dataclass, field
from typing import Any

from gateway.sim.tokens import OutputText


class State(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


@dataclass(frozen=True, slots=True)
class Token:
    token_id: int
    text: str
    #: Set on the last token ("stop" or "length"): vLLM puts it in the same chunk.
    finish_reason: str | None = None


@dataclass(frozen=True, slots=True)
class Finish:
    reason: str


@dataclass(frozen=True, slots=True)
class Failed:
    """The engine refused the request after queueing (llama.cpp context overflow)."""

    status: int
    error: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Aborted:
    pass


Event = Token | Finish | Failed | Aborted


@dataclass(slots=True)
class RequestRecord:
    """Per-request observations served by `GET /sim/stats` (simulated seconds)."""

    id: str
    x_request_id: str | None
    endpoint: str
    arrival: float
    arrival_wall: float
    headers_seen: dict[str, str]
    body: dict[str, Any]
    stream: bool = False
    prompt_tokens: int = 0
    priority: int = 0
    scheduled: float | None = None
    first_token: float | None = None
    first_token_wall: float | None = None
    finish: float | None = None
    finish_wall: float | None = None
    cached_tokens: int = 0
    #: vLLM: prompt tokens this request wrote to the prefix cache (whole blocks).
    created_cache_tokens: int = 0
    output_tokens: int = 0
    preemptions: int = 0
    #: llama.cpp: found no usable slot at first and waited in the deferred queue.
    deferred: bool = False
    aborted: bool = False
    abort_time: float | None = None
    abort_wall: float | None = None
    disconnect_time: float | None = None
    disconnect_wall: float | None = None
    finish_reason: str | None = None
    error: str | None = None
    slot: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True, eq=False)
class SimRequest:
    """A request inside the engine. Identity-hashed: one object per request."""

    rid: str
    prompt: list[int]
    #: Hard cap on output tokens (request cap or remaining context).
    max_output: int
    #: Tokens to generate before stopping by itself ("stop"); may exceed max_output.
    natural_len: int
    output: OutputText
    record: RequestRecord
    priority: int = 0
    cache_salt: str | None = None
    id_slot: int | None = None
    cache_prompt: bool = True
    state: State = State.WAITING
    #: Tokens (prompt + output) whose KV has been computed.
    num_computed: int = 0
    output_ids: list[int] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)
    #: Blocks of `blocks` already registered in the prefix cache.
    cached_blocks: int = 0
    scheduled_once: bool = False
    last_token_time: float | None = None
    slot: int | None = None
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.output_ids)

    def token_range(self, start: int, end: int) -> list[int]:
        """Tokens `start:end` of prompt + output, without copying the whole sequence."""
        p = len(self.prompt)
        if end <= p:
            return self.prompt[start:end]
        if start >= p:
            return self.output_ids[start - p : end - p]
        return self.prompt[start:] + self.output_ids[: end - p]

    @property
    def live(self) -> bool:
        return self.state in (State.WAITING, State.RUNNING)

    def stop_reason(self) -> str | None:
        """'stop' or 'length' once generation must end, else None."""
        n = len(self.output_ids)
        if n >= self.natural_len and self.natural_len <= self.max_output:
            return "stop"
        if n >= self.max_output:
            return "length"
        return None
