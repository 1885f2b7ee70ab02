"""The engine adapter interface and the shared error normalisation."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal, Protocol

from gateway.engines.probe import EngineGet, EnginePost, LiveReader
from gateway.errors import OPENAI_ERROR_TYPES, ContextLengthExceeded, GatewayError, UpstreamError

_MAX_ERROR_TEXT = 2000


class EngineAdapter(Protocol):
    """Everything engine-specific, for one engine kind (`gateway/engines/README.md`)."""

    kind: str
    #: an OpenAI-compatible upstream of unknown make (kind not detected)
    generic: bool
    # Send non-streaming requests upstream as streams (abortable) and reassemble.
    stream_upstream: bool
    # Return the connection to the pool after a streamed response.
    reuse_after_stream: bool
    #: the body field that pins a request to one of the engine's slots (None: no slots)
    slot_field: str | None
    #: exact prompt token counts (`tokens: engine`) from the engine
    counts_tokens: bool

    def normalize_error(self, status: int, body: bytes) -> GatewayError: ...

    def set_output_limit(self, body: dict[str, Any], limit: int) -> None: ...

    async def detect(self, get: EngineGet) -> bool:
        """Whether the replica behind `get` runs this engine (`kind: auto`)."""
        ...

    async def context_length(self, get: EngineGet) -> int | None:
        """The per-request context the engine reports beyond `/v1/models`."""
        ...

    def live_reader(self) -> LiveReader | None:
        """A reader of one replica's live state (None: admitted on in-flight counts)."""
        ...

    async def count_tokens(
        self,
        post: EnginePost,
        endpoint: Literal["chat", "completions"],
        body: Mapping[str, Any],
        model: str | None,
    ) -> int:
        """The prompt's exact token count (only when `counts_tokens`), for `model`
        (the name forwarded)."""
        ...

    def cached_tokens(self, usage: Mapping[str, Any]) -> int | None:
        """Prompt tokens the engine served from its prefix cache, from `usage`."""
        ...


def decode_error_body(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return body.decode("utf-8", "replace")[:_MAX_ERROR_TEXT]


def _status_type(status: int) -> str:
    if status in (401, 403):
        return "authentication_error" if status == 401 else "permission_error"
    if status == 404:
        return "not_found_error"
    if status == 429:
        return "rate_limit_error"
    if 400 <= status < 500:
        return "invalid_request_error"
    return "server_error"


def openai_error(
    status: int,
    message: str,
    *,
    type_: str | None = None,
    param: str | None = None,
    code: str | None = None,
) -> GatewayError:
    if code == "context_length_exceeded":
        return ContextLengthExceeded(message, param=param or "messages", status=status)
    err = UpstreamError(message, param=param, code=code, status=status)
    err.type = type_ if type_ in OPENAI_ERROR_TYPES else _status_type(status)
    return err


def looks_like_context_error(message: str) -> bool:
    m = message.lower()
    return "context length" in m or "context_length" in m or "exceed_context_size" in m


class GenericAdapter:
    """OpenAI-compatible upstream of unknown make: keep what is OpenAI-shaped."""

    kind = "unknown"
    generic = True
    stream_upstream = False
    reuse_after_stream = True
    slot_field: str | None = None
    counts_tokens = False

    def normalize_error(self, status: int, body: bytes) -> GatewayError:
        data = decode_error_body(body)
        err = data.get("error") if isinstance(data, dict) else None
        if isinstance(err, dict):
            message = str(err.get("message") or f"upstream returned HTTP {status}")
            code = err.get("code") if isinstance(err.get("code"), str) else None
            if code is None and looks_like_context_error(message):
                code = "context_length_exceeded"
            param = err.get("param") if isinstance(err.get("param"), str) else None
            type_ = err.get("type") if isinstance(err.get("type"), str) else None
            return openai_error(status, message, type_=type_, param=param, code=code)
        if isinstance(err, str):
            return openai_error(status, err)
        text = data if isinstance(data, str) and data else f"upstream returned HTTP {status}"
        return openai_error(status, str(text))

    def set_output_limit(self, body: dict[str, Any], limit: int) -> None:
        if "max_completion_tokens" in body:
            body["max_completion_tokens"] = limit
        body["max_tokens"] = limit

    async def detect(self, get: EngineGet) -> bool:
        return False

    async def context_length(self, get: EngineGet) -> int | None:
        return None

    def live_reader(self) -> LiveReader | None:
        return None

    async def count_tokens(
        self,
        post: EnginePost,
        endpoint: Literal["chat", "completions"],
        body: Mapping[str, Any],
        model: str | None,
    ) -> int:
        raise NotImplementedError(f"{self.kind} does not count tokens")

    def cached_tokens(self, usage: Mapping[str, Any]) -> int | None:
        """OpenAI's `usage.prompt_tokens_details.cached_tokens`."""
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
        return cached if isinstance(cached, int) and not isinstance(cached, bool) else None


def prompt_text(prompt: Any) -> str:
    """A completions prompt as text (token-id prompts are not counted remotely)."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        return "".join(prompt)
    raise ValueError("token-id prompts are counted by the estimate")


def token_count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"not a token count: {value!r}")
    return value
