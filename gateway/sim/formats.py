"""Response bodies, chunk by chunk, in each engine's exact shape.

vLLM chat stream: a role chunk (`delta: {"role": "assistant", "content": ""}`),
one chunk per token with `logprobs: null`, the last token's chunk carrying
`finish_reason` and `stop_reason: null`, a usage chunk with `choices: []` when
`stream_options.include_usage`, then `data: [DONE]`.

llama.cpp chat stream: a role chunk (`content: null`), one chunk per token, a
finish chunk with an empty delta, a usage chunk when asked, `timings` on the
last chunk, then `data: [DONE]` (OpenAI-compatible endpoints only; the native
`/completion` stream ends without it). llama.cpp chat choices carry no
`logprobs` key (its completions choices do); native stream pieces carry their
token ids and `id_slot: -1`, the final one `generation_settings` and `prompt`.

vLLM 0.32 bodies and chunks also carry the fields the simulator has no use for, as
nulls (`token_ids`, `prompt_token_ids`, `kv_transfer_params`, ...), and the
`system_fingerprint` on whole bodies and on the last chunk.

`usage.prompt_tokens_details.cached_tokens` is always present (vLLM fills it
only with `--enable-prompt-tokens-details`); vLLM adds `created_cache_tokens`
on chat (here: the whole blocks this request wrote; null on whole completions
bodies, absent from completions streams), and `multimodal_tokens` on whole bodies.
"""

from __future__ import annotations

import time
from typing import Any

from gateway.sim.llamabodies import LLAMA_BUILD, task_settings
from gateway.sim.protocol import Job
from gateway.sim.request import RequestRecord
from gateway.sim.vllmbodies import (
    VLLM_FINGERPRINT,
    vllm_body_extras,
    vllm_choice_extras,
    vllm_message,
)

__all__ = ["LLAMA_BUILD", "Formatter", "timings"]


class Formatter:
    """Builds the JSON objects of one response."""

    def __init__(self, flavor: str, job: Job, response_id: str) -> None:
        self.flavor = flavor
        self.job = job
        self.id = response_id
        self.created = int(time.time())
        self._object = "chat.completion" if job.endpoint == "chat" else "text_completion"

    @property
    def sends_done(self) -> bool:
        return self.job.endpoint != "native"

    # --- streaming ---------------------------------------------------------------
    def role_chunk(self) -> dict[str, Any] | None:
        if self.job.endpoint != "chat":
            return None
        content: str | None = "" if self.flavor == "vllm" else None
        return self._chunk({"role": "assistant", "content": content}, None)

    def token_chunk(
        self, text: str, finish: str | None, rec: RequestRecord, token: int = 0
    ) -> dict[str, Any]:
        if self.job.endpoint == "native":
            return self._native(text, rec, final=False, token=token)
        if self.flavor == "llamacpp":
            finish = None
        if self.job.endpoint == "chat":
            chunk = self._chunk({"content": text}, finish)
        else:
            chunk = self._chunk(text, finish)
        if self.flavor == "vllm" and finish is not None and not self.job.include_usage:
            chunk["system_fingerprint"] = VLLM_FINGERPRINT
        return chunk

    def final_chunks(self, reason: str, rec: RequestRecord) -> list[dict[str, Any]]:
        """Chunks after the last token (finish, usage, timings)."""
        if self.job.endpoint == "native":
            return [self._native("", rec, final=True, reason=reason)]
        chunks: list[dict[str, Any]] = []
        if self.flavor == "llamacpp":
            chunks.append(self._chunk({} if self.job.endpoint == "chat" else "", reason))
        if self.job.include_usage:
            usage = self.usage(rec, streamed=True)
            chunks.append(self._envelope([], self._object + ".chunk", usage=usage))
            if self.flavor == "vllm":
                chunks[-1]["system_fingerprint"] = VLLM_FINGERPRINT
        if self.flavor == "llamacpp" and chunks:
            chunks[-1]["timings"] = timings(rec)
        return chunks

    # --- whole bodies --------------------------------------------------------------
    def full_body(self, text: str, reason: str, rec: RequestRecord) -> dict[str, Any]:
        if self.job.endpoint == "native":
            return self._native(text, rec, final=True, reason=reason)
        if self.job.endpoint == "chat":
            choice: dict[str, Any] = {"index": 0, "message": self._message(text)}
        else:
            choice = {"index": 0, "text": text}
        if self.flavor == "vllm" or self.job.endpoint != "chat":
            choice["logprobs"] = None
        choice["finish_reason"] = reason
        if self.flavor == "vllm":
            choice["stop_reason"] = None
            choice.update(vllm_choice_extras(self.job.endpoint, stream=False))
        body = self._envelope([choice], self._object, usage=self.usage(rec))
        if self.flavor == "llamacpp":
            body["timings"] = timings(rec)
        else:
            body.update(vllm_body_extras(self.job.endpoint))
        return body

    def usage(self, rec: RequestRecord, streamed: bool = False) -> dict[str, Any]:
        details: dict[str, Any] = {"cached_tokens": rec.cached_tokens}
        usage: dict[str, Any] = {
            "prompt_tokens": rec.prompt_tokens,
            "completion_tokens": rec.output_tokens,
            "total_tokens": rec.prompt_tokens + rec.output_tokens,
            "prompt_tokens_details": details,
        }
        if self.flavor != "vllm":
            return usage
        if self.job.endpoint == "chat":
            details["created_cache_tokens"] = rec.created_cache_tokens
        elif not streamed:
            details["created_cache_tokens"] = None  # vLLM 0.32 fills it for chat only
        if not streamed:
            details["multimodal_tokens"] = None
            usage["completion_tokens_details"] = None
        return usage

    # --- helpers -------------------------------------------------------------------
    def _message(self, text: str) -> dict[str, Any]:
        if self.flavor == "llamacpp":
            return {"role": "assistant", "content": text}
        return vllm_message(text)

    def _chunk(self, delta: dict[str, Any] | str, finish: str | None) -> dict[str, Any]:
        if isinstance(delta, dict):
            choice: dict[str, Any] = {"index": 0, "delta": delta}
        else:
            choice = {"index": 0, "text": delta}
        if self.flavor == "vllm" or not isinstance(delta, dict):
            choice["logprobs"] = None
        choice["finish_reason"] = finish
        if self.flavor == "vllm" and (finish is not None or not isinstance(delta, dict)):
            choice["stop_reason"] = None
        chunk = self._envelope([choice], self._object + ".chunk")
        if self.flavor == "vllm":
            role = isinstance(delta, dict) and "role" in delta
            if role:
                chunk.update(prompt_token_ids=None, prompt_text=None)
            else:
                choice.update(vllm_choice_extras(self.job.endpoint, stream=True))
        return chunk

    def _envelope(self, choices: list[dict[str, Any]], obj: str, **extra: Any) -> dict[str, Any]:
        if obj == "text_completion.chunk":
            obj = "text_completion"  # completions chunks reuse the object name
        body: dict[str, Any] = {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.job.model,
            "choices": choices,
        }
        if self.flavor == "llamacpp":
            body["system_fingerprint"] = LLAMA_BUILD
        body.update(extra)
        return body

    def _native(
        self, text: str, rec: RequestRecord, final: bool, reason: str | None = None, token: int = 0
    ) -> dict[str, Any]:
        if not final:  # a streamed piece: its token ids, no slot yet (-1), no model
            return {
                "index": 0,
                "content": text,
                "tokens": [token],
                "stop": False,
                "id_slot": -1,
                "tokens_predicted": rec.output_tokens,
                "tokens_evaluated": rec.prompt_tokens,
            }
        body: dict[str, Any] = {
            "index": 0,
            "content": text,
            "tokens": [],
            "id_slot": rec.slot,
            "stop": True,
            "model": self.job.model,
            "tokens_predicted": rec.output_tokens,
            "tokens_evaluated": rec.prompt_tokens,
        }
        body.update(
            generation_settings=task_settings(
                self.job.cap or -1, self.job.stream, self.job.ignore_eos
            ),
            prompt="",
            stop_type="eos" if reason == "stop" else "limit",
            stopping_word="",
            has_new_line=False,
            truncated=False,
            tokens_cached=rec.cached_tokens,
            timings=timings(rec),
        )
        return body


def timings(rec: RequestRecord) -> dict[str, Any]:
    """llama.cpp's per-request `timings` (simulated milliseconds)."""
    start = rec.scheduled if rec.scheduled is not None else rec.arrival
    first = rec.first_token if rec.first_token is not None else start
    end = rec.finish if rec.finish is not None else first
    prompt_n = rec.prompt_tokens - rec.cached_tokens
    prompt_ms, predicted_ms = (first - start) * 1000.0, (end - first) * 1000.0
    predicted_n = rec.output_tokens
    return {
        "cache_n": rec.cached_tokens,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": 1000.0 * prompt_n / prompt_ms if prompt_ms else 0.0,
        "predicted_n": predicted_n,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / predicted_n if predicted_n else 0.0,
        "predicted_per_second": 1000.0 * predicted_n / predicted_ms if predicted_ms else 0.0,
    }
