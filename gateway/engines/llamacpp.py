"""llama.cpp (`llama-server`) adapter.

Non-streaming client requests are sent upstream as streams and reassembled
(`gateway.forward.reassemble`), because llama.cpp only notices a dropped
non-streaming connection after a second of total inactivity; connections are
not reused after a stream, because llama-server closes them.

Errors: `{"error": {"code": <int>, "message", "type"}}` without `param`;
context overflow is type `exceed_context_size_error` with `n_prompt_tokens`
and `n_ctx`. Output limits: the OpenAI endpoints read `max_tokens` (and
`max_completion_tokens`), the native ones `n_predict`; all are set alike.
"""

from __future__ import annotations

from typing import Any

from gateway.engines.base import GenericAdapter, decode_error_body, openai_error
from gateway.errors import GatewayError


class LlamaCppAdapter(GenericAdapter):
    kind = "llamacpp"
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
