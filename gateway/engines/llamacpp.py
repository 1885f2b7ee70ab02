"""llama.cpp (`llama-server`) adapter.

Non-streaming client requests are sent upstream as streams and reassembled
(`gateway.forward.reassemble`), because llama.cpp only notices a dropped
non-streaming connection after a second of total inactivity; connections are
not reused after a stream, because llama-server closes them.

Errors: `{"error": {"code": <int>, "message", "type"}}` without `param`;
context overflow is type `exceed_context_size_error` with `n_prompt_tokens`
and `n_ctx`. Output limits: the OpenAI endpoints read `max_tokens` (and
`max_completion_tokens`), the native ones `n_predict`; all are set alike.

Detection: `/props` with `default_generation_settings`; its `n_ctx` is the
per-slot context. Slots: `id_slot` pins a request to one. Live state:
`/props` (until it answered once), `/slots`, and `/metrics` unless it
answered 404/501 (started without `--metrics`): `readings.parse_llamacpp`.
Token counts: `POST /apply-template` (chat) then `POST /tokenize`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from gateway.engines.base import (
    GenericAdapter,
    decode_error_body,
    openai_error,
    prompt_text,
    token_count,
)
from gateway.engines.probe import EngineGet, EnginePost, LiveReader
from gateway.engines.readings import EngineReading, parse_llamacpp
from gateway.errors import GatewayError


def _n_ctx(props: Any) -> int | None:
    settings = props.get("default_generation_settings") if isinstance(props, dict) else None
    n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
    return n_ctx if isinstance(n_ctx, int) and n_ctx > 0 else None


class _SlotsReader:
    """`/props` until it answered once, `/slots`, `/metrics` until a 404/501."""

    def __init__(self) -> None:
        self._props: Any = None
        self._metrics = True

    async def read(self, get: EngineGet) -> EngineReading:
        if self._props is None:
            self._props = await get.json("/props")
        slots = await get.json("/slots")
        text = None
        if self._metrics:
            text = await get.text("/metrics")
            self._metrics = text is not None
        return parse_llamacpp(self._props, slots, text)


class LlamaCppAdapter(GenericAdapter):
    kind = "llamacpp"
    generic = False
    slot_field: str | None = "id_slot"
    counts_tokens = True
    # A dropped non-streaming request is only noticed after ~1 s of total
    # server inactivity; a dropped stream within ~30 ms (tests/engine/golden/NOTES.md).
    stream_upstream = True
    # llama-server closes the connection after every stream despite keep-alive.
    reuse_after_stream = False

    def normalize_error(self, status: int, body: bytes) -> GatewayError:
        data = decode_error_body(body)
        err = data.get("error") if isinstance(data, dict) else None
        if isinstance(err, dict) and err.get("type") == "exceed_context_size_error":
            n_prompt, n_ctx = err.get("n_prompt_tokens"), err.get("n_ctx")
            message = str(err.get("message") or "")
            if n_prompt is not None and n_ctx is not None:
                message = (
                    f"This model's maximum context length is {n_ctx} tokens. However, your "
                    f"request has {n_prompt} input tokens. ({message})"
                )
            return openai_error(status, message, code="context_length_exceeded")
        if isinstance(err, dict) and err.get("type") == "unavailable_error":
            return openai_error(status, str(err.get("message") or "unavailable"))
        return super().normalize_error(status, body)

    def set_output_limit(self, body: dict[str, Any], limit: int) -> None:
        body["max_tokens"] = limit
        if "max_completion_tokens" in body:
            body["max_completion_tokens"] = limit
        if "n_predict" in body:
            body["n_predict"] = limit

    async def detect(self, get: EngineGet) -> bool:
        text = await get.text("/props")
        return text is not None and "default_generation_settings" in text

    async def context_length(self, get: EngineGet) -> int | None:
        return _n_ctx(await get.json("/props"))

    def live_reader(self) -> LiveReader | None:
        return _SlotsReader()

    async def count_tokens(
        self,
        post: EnginePost,
        endpoint: Literal["chat", "completions"],
        body: Mapping[str, Any],
        model: str | None,
    ) -> int:
        if endpoint == "chat":
            rendered = await post("/apply-template", {"messages": body["messages"]})
            text = rendered["prompt"]
        else:
            text = prompt_text(body.get("prompt"))
        result = await post("/tokenize", {"content": text})
        tokens = result["tokens"]
        if not isinstance(tokens, list):
            raise TypeError("/tokenize returned no token list")
        return token_count(len(tokens))
