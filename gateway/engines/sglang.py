"""SGLang (`sglang.launch_server`) adapter.

OpenAI endpoints `/v1/chat/completions`, `/v1/completions`, `/v1/models`
(`data[].max_model_len`). Errors are flat, not under `error`:
`{"object": "error", "message", "type", "param", "code": <int>}`; a prompt
over the context says "... longer than the model's context length ...".
Output limits: `max_tokens` and `max_completion_tokens`, set alike.

Detection: `GET /get_server_info` answers its server arguments and scheduler
info (`max_total_num_tokens`, `context_length`, `max_running_requests`).
Live state: `/metrics` (`sglang:` names, `readings.parse_sglang`) and
`/get_server_info` once. Prefix-cache hits: `usage.prompt_tokens_details.
cached_tokens` (with `--enable-cache-report`). Token counts: the estimate.

Cancellation: a dropped stream aborts the request at once (the response's
abort task); a non-streaming request notices a dropped client only when its
wait for output times out (seconds), so those are sent upstream as streams
and reassembled. Connections are reused after a stream.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.engines.base import GenericAdapter, decode_error_body
from gateway.engines.probe import EngineGet, LiveReader
from gateway.engines.readings import EngineReading, parse_sglang
from gateway.errors import GatewayError


def _server_info(answer: Any) -> dict[str, Any] | None:
    ok = isinstance(answer, dict) and "max_total_num_tokens" in answer
    return answer if ok else None


class _MetricsReader:
    """`/get_server_info` until it answered once, then `/metrics`."""

    def __init__(self) -> None:
        self._info: dict[str, Any] | None = None

    async def read(self, get: EngineGet) -> EngineReading:
        if self._info is None:
            self._info = _server_info(await get.json("/get_server_info"))
        return parse_sglang(await get.text("/metrics") or "", self._info)


class SGLangAdapter(GenericAdapter):
    kind = "sglang"
    generic = False
    stream_upstream = True

    def normalize_error(self, status: int, body: bytes) -> GatewayError:
        data = decode_error_body(body)
        if isinstance(data, dict) and data.get("object") == "error" and "message" in data:
            wrapped = {"error": {k: v for k, v in data.items() if k != "object"}}
            return super().normalize_error(status, _json_bytes(wrapped))
        return super().normalize_error(status, body)

    async def detect(self, get: EngineGet) -> bool:
        return _server_info(await get.json("/get_server_info")) is not None

    async def context_length(self, get: EngineGet) -> int | None:
        info = _server_info(await get.json("/get_server_info")) or {}
        n = info.get("context_length")
        return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None

    def live_reader(self) -> LiveReader | None:
        return _MetricsReader()


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value).encode()
