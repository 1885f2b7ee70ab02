"""vLLM adapter.

Errors: `{"error": {"message", "type", "param", "code": <int>}}`; `--api-key`
failures are `{"error": "Unauthorized"}`. The integer `code` is dropped (the
OpenAI shape wants a string or null); context-length errors get the OpenAI
code `context_length_exceeded`. `max_completion_tokens` wins over
`max_tokens` in vLLM, so both are set to the same value.

Detection: `/metrics` with `vllm:` names. Live state: `/metrics`
(`readings.parse_vllm_metrics`). Token counts: `POST /tokenize` with the
messages (chat template applied, tools included) or the prompt, answering
`count`. Closing the connection aborts a request, streamed or not.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from gateway.engines.base import GenericAdapter, prompt_text, token_count
from gateway.engines.probe import EngineGet, EnginePost, LiveReader
from gateway.engines.readings import EngineReading, parse_vllm_metrics


class _MetricsReader:
    async def read(self, get: EngineGet) -> EngineReading:
        return parse_vllm_metrics(await get.text("/metrics") or "")


class VLLMAdapter(GenericAdapter):
    kind = "vllm"
    generic = False
    counts_tokens = True

    def set_output_limit(self, body: dict[str, Any], limit: int) -> None:
        body["max_tokens"] = limit
        if "max_completion_tokens" in body:
            body["max_completion_tokens"] = limit

    async def detect(self, get: EngineGet) -> bool:
        text = await get.text("/metrics")
        return text is not None and "vllm:" in text

    def live_reader(self) -> LiveReader | None:
        return _MetricsReader()

    async def count_tokens(
        self,
        post: EnginePost,
        endpoint: Literal["chat", "completions"],
        body: Mapping[str, Any],
        model: str | None,
    ) -> int:
        payload: dict[str, Any] = {"model": model}
        if endpoint == "chat":
            payload.update(messages=body["messages"], add_generation_prompt=True)
            if body.get("tools"):
                payload["tools"] = body["tools"]
        else:
            payload["prompt"] = prompt_text(body.get("prompt"))
        result = await post("/tokenize", payload)
        return token_count(result["count"])
