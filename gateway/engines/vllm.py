"""vLLM adapter.

Errors: `{"error": {"message", "type", "param", "code": <int>}}`; `--api-key`
failures are `{"error": "Unauthorized"}`. The integer `code` is dropped (the
OpenAI shape wants a string or null); context-length errors get the OpenAI
code `context_length_exceeded`. `max_completion_tokens` wins over
`max_tokens` in vLLM, so both are set to the same value.
"""

from __future__ import annotations

from typing import Any

from gateway.engines.base import GenericAdapter


class VLLMAdapter(GenericAdapter):
    kind = "vllm"

    def set_output_limit(self, body: dict[str, Any], limit: int) -> None:
        body["max_tokens"] = limit
        if "max_completion_tokens" in body:
            body["max_completion_tokens"] = limit
